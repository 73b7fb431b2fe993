"""kolo.tensorflow: Horovod's horovod.tensorflow API on kolo, for TensorFlow 2 on CPU.

A Horovod TensorFlow script runs after changing its import line:

    import kolo.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_step:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

and starts with `kolorun -np N python3 train.py`. Nothing is compiled against TensorFlow: the
collectives reach libkolo through ctypes, eagerly or as tf.numpy_function ops inside tf.function
(not under XLA). For Keras (Model.fit, callbacks) see kolo.keras.
"""

from kolo._lib import __version__  # noqa: F401
from kolo.basics import (  # noqa: F401
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, sycl_built, build_info, Average, Sum, Adasum, Min, Max, Product,
    ProcessSet, global_process_set, add_process_set, remove_process_set, start_timeline, stop_timeline,
    engine_stats, engine_params, status, elastic_round)
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from kolo.tensorflow.compression import Compression  # noqa: F401
from kolo.tensorflow.mpi_ops import (  # noqa: F401
    allreduce, grouped_allreduce, allgather, grouped_allgather, broadcast, broadcast_, alltoall, reducescatter,
    grouped_reducescatter, join, barrier, size_op, local_size_op, rank_op, local_rank_op, process_set_included_op)
from kolo.tensorflow.functions import (  # noqa: F401
    broadcast_variables, broadcast_global_variables, broadcast_object, broadcast_object_fn, allgather_object,
    BroadcastGlobalVariablesHook)
from kolo.tensorflow.optimizer import (  # noqa: F401
    DistributedGradientTape, DistributedOptimizer, PartialDistributedGradientTape)
from kolo.tensorflow import elastic, util  # noqa: F401  (hvd.elastic.run, TensorFlowKerasState, TensorFlowState)
from kolo.tensorflow.util import _executing_eagerly  # noqa: F401  (Horovod's scripts import it from here)


def __getattr__(name):
    # SyncBatchNormalization is a Keras layer: Keras is imported when it is first asked for, not
    # with kolo.tensorflow, which does not need it otherwise.
    if name == "SyncBatchNormalization":
        from kolo.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
