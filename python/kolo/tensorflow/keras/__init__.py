"""kolo.tensorflow.keras: the same module as kolo.keras, under Horovod's other name for it
(horovod.tensorflow.keras)."""

from kolo.keras import *  # noqa: F401,F403
from kolo.keras import DistributedOptimizer, PartialDistributedOptimizer, callbacks, load_model  # noqa: F401
