"""kolo.tensorflow.keras.callbacks: kolo.keras.callbacks under Horovod's other name for it."""

from kolo.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, BestModelCheckpoint)
