"""Gradient compression's framework-neutral part (Horovod's Compressor interface and the identity),
shared by kolo.torch.compression and kolo.tensorflow.compression, which add their fp16 casts."""


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
