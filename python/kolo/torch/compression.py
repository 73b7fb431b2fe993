"""Gradient compression for the wire (Horovod's horovod.torch.compression)."""

import torch


class Compressor:
    """compress(tensor) -> (tensor, ctx) before the collective; decompress(tensor, ctx) after."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


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
