"""kolo.keras: Horovod's horovod.tensorflow.keras (and horovod.keras) API on kolo, for tf.keras on CPU.

A Horovod Keras script runs after changing its import line:

    import kolo.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

and starts with `kolorun -np N python3 train.py`. Keras must run on TensorFlow (KERAS_BACKEND
unset or "tensorflow"), without XLA: compile(jit_compile=False) where Keras would choose it (it
does not on CPU-only machines).
"""

import tensorflow as tf

from kolo._lib import __version__  # noqa: F401
from kolo.basics import (  # noqa: F401
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, sycl_built, build_info, Average, Sum, Adasum, Min, Max, Product,
    ProcessSet, global_process_set, add_process_set, remove_process_set, start_timeline, stop_timeline,
    engine_stats, engine_params, status, elastic_round)
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from kolo.tensorflow import mpi_ops as _tf_ops
from kolo.tensorflow.compression import Compression  # noqa: F401
from kolo.tensorflow.functions import broadcast_object, allgather_object  # noqa: F401
from kolo.tensorflow.optimizer import DistributedOptimizer as _tf_distributed_optimizer
from kolo.tensorflow.optimizer import PartialDistributedOptimizer as _tf_partial_distributed_optimizer
from kolo.tensorflow.optimizer import distributed_class

try:
    _backend = tf.keras.backend.backend()
except AttributeError:  # Keras 2 (tf_keras): always TensorFlow
    _backend = "tensorflow"
if _backend != "tensorflow":
    raise ImportError("kolo.keras needs Keras on the TensorFlow backend; KERAS_BACKEND is %r" % _backend)

from kolo.keras import callbacks, elastic  # noqa: E402,F401


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A Keras optimizer like `optimizer` that averages the gradients over every rank before applying
    them (a new optimizer made from optimizer.get_config(), as Horovod does). See
    kolo.tensorflow.DistributedOptimizer."""
    return _tf_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op, gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer, except that the gradients of local_layers' trainable variables are not
    allreduced: each rank applies its own (divided by the process set's size when
    scale_local_gradients, as in Horovod). See kolo.tensorflow.optimizer.PartialDistributedOptimizer."""
    return _tf_partial_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op, backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups, process_set=process_set,
        local_layers=local_layers, scale_local_gradients=scale_local_gradients)


def broadcast_global_variables(root_rank):
    """TensorFlow 1's global variables do not exist in TensorFlow 2."""
    raise NotImplementedError("broadcast_global_variables is TensorFlow 1 only. Use "
                              "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) with fit(), or "
                              "kolo.tensorflow.broadcast_variables(model.variables, root_rank)")


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=global_process_set):
    """op over every rank's value (Average by default); returns a NumPy value."""
    return _tf_ops.allreduce(tf.convert_to_tensor(value), average=average, compression=compression, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name,
                             process_set=process_set).numpy()


def allgather(value, name=None, process_set=global_process_set):
    """Every rank's value concatenated along the first dimension; returns a NumPy value."""
    return _tf_ops.allgather(tf.convert_to_tensor(value), name=name, process_set=process_set).numpy()


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """root_rank's value on every rank; returns a NumPy value."""
    return _tf_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name, process_set=process_set).numpy()


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """This rank's share of the first dimension of op over every rank's value; returns a NumPy value."""
    return _tf_ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op, process_set=process_set).numpy()


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """Loads a saved Keras model (keras.models.load_model) and makes its optimizer distributed in
    place, keeping the state it was saved with (iterations, momenta). custom_optimizers: optimizer
    classes the file refers to that Keras does not know by name."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects.setdefault(cls.__name__, cls)
    model = tf.keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not getattr(opt, "_kolo_distributed", False):
        opt.__class__ = distributed_class(opt.__class__, dict(
            op=Average, compression=compression, sparse_as_dense=False, gradient_predivide_factor=1.0, groups=None,
            process_set=global_process_set))
    return model

