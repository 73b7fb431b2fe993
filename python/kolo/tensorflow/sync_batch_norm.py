"""SyncBatchNormalization: Keras batch normalization whose training statistics cover every rank's batch
(Horovod's horovod.tensorflow.SyncBatchNormalization).

While training, each rank computes its batch's moments per channel as Keras does (mean m_i and
variance v_i over n_i values; masks count as Keras counts them), then one allreduce (Sum) of the
float64 vector [n_i*m_i, n_i*(v_i + m_i^2), n_i] gives the totals S1, S2, N, and

    mean = S1 / N,    variance = S2 / N - mean^2

are the moments of the concatenated global batch: each rank weighs by its own count, so uneven
batches (even an empty one) are right. Horovod averages the ranks' moments with equal weights,
which is the same thing only when every rank has the same batch size. The sums travel in float64
so that the subtraction does not lose what float32 moments carry. Keras then normalizes with the
global moments and updates the moving mean and variance from them, so those stay identical on every
rank. The allreduce is differentiable (its gradient is the Sum-allreduce of the gradients), so the
gradient of each rank's input is that of the loss summed over all ranks. At inference (training
False, or a non-trainable layer) the moving statistics are used and nothing is sent.

Keras 3 computes a batch's moments in _moments(inputs, mask); Keras 2 (tf_keras) in
_calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask), with fused=False (the fused kernel
computes them inside one op). Those are what the class overrides.
"""

import tensorflow as tf

from kolo.basics import Sum, _elastic, size
from kolo.tensorflow.mpi_ops import allreduce

_BatchNormalization = tf.keras.layers.BatchNormalization
_KERAS3 = not hasattr(_BatchNormalization, "_calculate_mean_and_var")


def _global_moments(mean, variance, count):
    """The moments of every rank's values from this rank's (mean, variance over count values; count
    broadcasts to mean's shape)."""
    m = tf.cast(mean, tf.float64)
    v = tf.cast(variance, tf.float64)
    n = tf.broadcast_to(tf.cast(count, tf.float64), tf.shape(m))
    # A rank without values has NaN moments: multiply_no_nan makes its share exactly zero.
    packed = tf.stack([tf.math.multiply_no_nan(m, n), tf.math.multiply_no_nan(v + tf.square(m), n), n])
    s1, s2, total = tf.unstack(allreduce(packed, op=Sum))
    gmean = s1 / total
    gvar = tf.maximum(s2 / total - tf.square(gmean), 0.0)
    return tf.cast(gmean, mean.dtype), tf.cast(gvar, variance.dtype)


def _count(inputs, axes, mask=None, keepdims=False):
    """How many values each channel's moments cover: the product of the reduced dimensions, or the
    mask's weight summed over them (the mask has the input's shape without the last axis)."""
    if mask is None:
        shape = tf.shape(inputs)
        return tf.reduce_prod(tf.gather(shape, list(axes)))
    w = tf.cast(mask, tf.float64)
    w = tf.broadcast_to(tf.expand_dims(w, -1), tf.shape(inputs))
    c = tf.reduce_sum(w, axis=list(axes), keepdims=True)
    return c if keepdims else tf.squeeze(c)


@tf.keras.utils.register_keras_serializable(package="kolo")
class SyncBatchNormalization(_BatchNormalization):
    """Batch normalization whose batch mean and variance, while training, are those of the global
    batch: every rank's batch together, each weighted by its size. At inference it uses the moving
    statistics, which are updated from the global moments and so stay the same on every rank. Takes
    BatchNormalization's arguments; fused must be False (as in Horovod), and Keras 3's
    synchronized (tf.distribute's) is refused. Every rank must call the layer in training equally
    often and in the same order relative to its other collectives."""

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes over kolo's ranks; synchronized=True "
                             "(tf.distribute's) does not apply")
        if not _KERAS3:
            kwargs["fused"] = False
        super().__init__(**kwargs)

    if _KERAS3:
        def _moments(self, inputs, mask):
            mean, variance = super()._moments(inputs, mask)
            if size() == 1 and not _elastic():
                return mean, variance
            return _global_moments(mean, variance, _count(inputs, self._reduction_axes, mask))
    else:
        def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
            mean, variance = super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=mask)
            if size() == 1 and not _elastic():
                return mean, variance
            return _global_moments(mean, variance, _count(inputs, reduction_axes, mask, keep_dims))
