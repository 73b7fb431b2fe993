"""Gradient compression for the wire (Horovod's horovod.torch.compression)."""

import torch

from kolo._compression import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Casts floating-point tensors to float16 for the collective and back afterwards; other
    dtypes pass untouched."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        dtype = ctx
        if dtype is not None and dtype.is_floating_point and tensor.dtype != dtype:
            return tensor.type(dtype)
        return tensor


class Compression:
    """Optional gradient compression algorithms used during allreduce."""
    none = NoneCompressor
    fp16 = FP16Compressor
