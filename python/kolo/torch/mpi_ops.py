"""kolo.torch's collectives on PyTorch CPU tensors, with Horovod's names, signatures and
autograd rules (horovod/torch/mpi_ops.py). Tensors reach libkolo by address
(tensor.data_ptr()); nothing is compiled against PyTorch, so one package serves every
PyTorch release."""

import ctypes
import math
import warnings

import torch

from kolo import _lib, _ops, _pool
from kolo.basics import (Average, Sum, Adasum, Min, Max, Product, global_process_set,  # noqa: F401
                         ProcessSet)
from kolo.exceptions import HorovodInternalError  # noqa: F401
from kolo.torch.compression import Compression

_TORCH_TO_KOLO = {
    torch.uint8: _lib.UINT8, torch.int8: _lib.INT8, torch.int16: _lib.INT16, torch.int32: _lib.INT32,
    torch.int64: _lib.INT64, torch.float16: _lib.FLOAT16, torch.bfloat16: _lib.BFLOAT16,
    torch.float32: _lib.FLOAT32, torch.float64: _lib.FLOAT64, torch.bool: _lib.BOOL,
}
if hasattr(torch, "uint16"):  # PyTorch >= 2.3
    _TORCH_TO_KOLO[torch.uint16] = _lib.UINT16

# PyTorch >= 2.0 takes check_invariants=; recent releases warn (UserWarning) on every sparse tensor
# built without it. 1.13 always checks the indices against the size given, so ask for that.
_SPARSE_CHECK = {"check_invariants": True} if hasattr(torch.sparse, "check_sparse_tensor_invariants") else {}


class _TorchAdapter:
    """How kolo._ops sees PyTorch tensors."""

    @staticmethod
    def kdtype(t):
        # runs once per tensor per step: the cheap attribute tests (t.device builds an object)
        if not torch.is_tensor(t):
            raise TypeError("expected a torch.Tensor, got %s" % type(t).__name__)
        if not t.is_cpu:
            raise ValueError("kolo handles CPU tensors only; got a tensor on %s" % t.device)
        if t.is_sparse:
            raise ValueError("sparse tensors are not supported here; use sparse_as_dense=True or to_dense()")
        dt = _TORCH_TO_KOLO.get(t.dtype)
        if dt is None:
            raise ValueError("Tensor type %s is not supported." % t.type())
        return dt

    @staticmethod
    def contiguous(t):
        # A non-contiguous tensor travels as a contiguous copy; in-place variants copy the
        # result back into the original.
        return t if t.is_contiguous() else t.detach().contiguous()

    @staticmethod
    def ptr(t):
        return t.data_ptr()

    @staticmethod
    def shape(t):
        return t.shape  # a torch.Size is a tuple

    @staticmethod
    def copy_(dst, src):
        with torch.no_grad():
            dst.copy_(src)

    @staticmethod
    def over(raw, shape, like):
        # raw: the bytes of an output the engine allocated, as uint8 (kolo._ops._output)
        return torch.from_numpy(raw).view(like.dtype).reshape(shape)

    @staticmethod
    def from_c(ptr, shape, like):
        out = _empty(shape, like.dtype)
        n = out.numel() * out.element_size()
        if n:
            ctypes.memmove(out.data_ptr(), ptr, n)
        return out


_A = _TorchAdapter

# each tensor type's element size, and a NumPy type of that size for the blocks of kolo._pool
# (NumPy has no bfloat16)
_SIZE = {dt: torch.empty((), dtype=dt).element_size() for dt in _TORCH_TO_KOLO}
_NP_LIKE = {dt: {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[_SIZE[dt]] for dt in _TORCH_TO_KOLO}


def _empty(shape, dtype):
    """An output tensor; from _pool.MALLOC_KEEPS bytes, over a block of kolo._pool kept from step to
    step: fresh memory costs a page fault per 4 KiB at its first write, and PyTorch's allocator hands
    such blocks back to the kernel when a tensor goes, so every call paid again (2 ranks here, an
    out-of-place allreduce of 64 MB 48-64 ms against 13-16 kept). The block comes back when the
    tensor's memory is freed (torch.from_numpy holds the array, the array its lease). Below, the
    allocator keeps freed blocks itself."""
    if math.prod(shape) * _SIZE[dtype] < _pool.MALLOC_KEEPS:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(_pool.outputs.empty(tuple(shape), _NP_LIKE[dtype])).view(dtype)


def _new_output(tensor):
    _A.kdtype(tensor)
    return _empty(tensor.shape, tensor.dtype)


def handle_average_backwards_compatibility(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        return Average if average else Sum
    return Average


def poll(handle):
    """True if the asynchronous operation behind handle has completed."""
    return _ops.poll(handle)


def synchronize(handle):
    """Waits for an asynchronous operation and returns its output (allreduce, broadcast,
    allgather, reducescatter: a tensor; alltoall: (output, received_splits); grouped
    operations: a list). Failures raise HorovodInternalError with kolo's message."""
    out = _ops.synchronize(handle)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], list):  # alltoall
        return out[0], torch.tensor(out[1], dtype=torch.int32)
    return out


# ---- allreduce ----

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce of tensor (not modified) into a new tensor; returns a handle for
    poll()/synchronize(). Op defaults to Average."""
    op = handle_average_backwards_compatibility(op, average)
    return _ops.allreduce_async(_A, tensor, _new_output(tensor), name, op, prescale_factor, postscale_factor,
                                process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the gradient, same op."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = \
            average, op, prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                           process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, average=ctx.average, op=ctx.op, prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns a new tensor: op over every rank's tensor (Average: sum / size; integers
    truncate). Differentiable."""
    tensor_compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor, postscale_factor,
                                    process_set)
    return compression.decompress(summed, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """In-place variant of allreduce_async."""
    op = handle_average_backwards_compatibility(op, average)
    return _ops.allreduce_async(_A, tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In place; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    return _ops.grouped_allreduce_async(_A, tensors, [_new_output(t) for t in tensors], name, op,
                                        prescale_factor, postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average, ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = \
            average, op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                                         postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), average=ctx.average, op=ctx.op,
                                  prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None,) * 6 + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one group; returns a list. Differentiable."""
    compressed = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                         *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    return _ops.grouped_allreduce_async(_A, tensors, tensors, name, op, prescale_factor, postscale_factor,
                                        process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Allreduce of a sparse COO tensor as Horovod does it: allgather the indices and the
    values; the returned callable (call it after synchronizing) builds the summed tensor."""
    t = tensor.coalesce()
    idx_handle = allgather_async(t.indices().transpose(0, 1).contiguous(), name=None if name is None else
                                 "%s.indices" % name, process_set=process_set)
    val_handle = allgather_async(t.values().contiguous(), name=None if name is None else "%s.values" % name,
                                 process_set=process_set)

    def handle():
        values = synchronize(val_handle)
        indices = synchronize(idx_handle)
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, size=tensor.size(), **_SPARSE_CHECK)
    return handle


# ---- allgather ----

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: every rank's tensor concatenated along the first dimension."""
    return _ops.allgather_async(_A, tensor, name, process_set)


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather: the gradient is the averaged gradient's slice of this rank."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int32), process_set=ctx.process_set)
        r = ctx.process_set.rank()
        offset = int(dims[:r].sum().item()) if r > 0 else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's tensor along the first dimension (which may differ per rank;
    the other dimensions must agree). Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return _ops.grouped_allgather_async(_A, list(tensors), name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors; returns a list."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of root_rank's tensor into a new tensor on every rank."""
    return _ops.broadcast_async(_A, tensor, _new_output(tensor), root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast: the root gets the averaged gradient, the others zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if _lib.kolo_rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank (root_rank is a world rank). Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _ops.broadcast_async(_A, tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place; returns tensor."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall ----

def _splits_list(splits):
    if splits is None:
        return None
    if torch.is_tensor(splits):
        if splits.dim() != 1:
            raise ValueError("splits must be a 1-D tensor or list")
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize() returns (output, received_splits)."""
    return _ops.alltoall_async(_A, tensor, _splits_list(splits), name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient travels back with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.recvsplits, ctx.process_set = received_splits, process_set
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, grad_received_splits):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.recvsplits, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] first-dimension rows to rank r (None: equal parts). Returns the rows
    received in rank order; with splits given, (output, received_splits). Differentiable."""
    output, received_splits = HorovodAlltoall.apply(tensor, splits, name, process_set)
    if splits is None:
        return output
    return output, received_splits


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    return _ops.reducescatter_async(_A, tensor, name, op, prescale_factor, postscale_factor, process_set)


class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter: the gradient is the allgather of the gradients, scaled
    as the forward pass scaled."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set, ctx.scale = op, process_set, prescale_factor * postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        scale = ctx.scale
        if ctx.op == Average:
            scale = scale / ctx.process_set.size()
        if scale != 1.0:
            grad = grad * scale
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces every rank's tensor and returns this rank's share of the first dimension (the
    first dim % size ranks get one more row). Differentiable."""
    tensor_compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(tensor_compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _ops.grouped_reducescatter_async(_A, list(tensors), name, op, prescale_factor, postscale_factor,
                                            process_set)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed = [compression.compress(t) for t in tensors]
    outs = synchronize(grouped_reducescatter_async([c[0] for c in compressed], name, op, process_set,
                                                   prescale_factor, postscale_factor))
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


# ---- join and barrier ----

def join(device=-1, process_set=global_process_set):
    """This rank has no more batches: until every rank has joined, the other ranks' allreduces
    proceed with zeros from this one. Returns the last rank to join. device is accepted for
    Horovod compatibility (kolo is CPU-only)."""
    return synchronize(_ops.join_async(process_set))


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it."""
    synchronize(_ops.barrier_async(process_set))
