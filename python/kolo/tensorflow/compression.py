"""Gradient compression for the wire (Horovod's horovod.tensorflow.compression), on TensorFlow tensors."""

import tensorflow as tf

from kolo._compression import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype; the others as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """Optional gradient compression algorithms used during allreduce."""
    none = NoneCompressor
    fp16 = FP16Compressor
