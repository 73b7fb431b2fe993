"""kolo: data-parallel collectives over libkolo, for NumPy arrays.

    import numpy as np, kolo
    kolo.init()
    total = kolo.allreduce(np.ones(4, np.float32), op=kolo.Sum)   # on every rank: size() * 1
    kolo.shutdown()

Start N copies with `kolorun -np N python3 script.py`. The functions follow Horovod's
(horovod.torch) names and semantics; kolo.torch has the same API for PyTorch tensors.
Every collective must be called by every rank of its process set; unnamed operations must be
issued in the same order on every rank (they are named "<op>.noname.<n>").
"""

import ctypes
import weakref

import numpy as np

from kolo._lib import __version__, HAVE_ENGINE as _HAVE_ENGINE
from kolo import _lib, _ops, _pool
from kolo.basics import *  # noqa: F401,F403  (init, size, ops, process sets, ...)
from kolo.basics import __all__ as _basics_all
from kolo.basics import _shutdown_hooks
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt, KoloVersionMismatchError
from kolo._ops import poll, synchronize
from kolo import elastic  # noqa: F401  (kolo.elastic: State, ObjectState, run)
from kolo.runner import run  # noqa: F401  (horovod.run: a function on N ranks, from Python)

_NP_TO_KOLO = {
    np.dtype(np.uint8): _lib.UINT8, np.dtype(np.int8): _lib.INT8, np.dtype(np.uint16): _lib.UINT16,
    np.dtype(np.int16): _lib.INT16, np.dtype(np.int32): _lib.INT32, np.dtype(np.int64): _lib.INT64,
    np.dtype(np.float16): _lib.FLOAT16, np.dtype(np.float32): _lib.FLOAT32,
    np.dtype(np.float64): _lib.FLOAT64, np.dtype(np.bool_): _lib.BOOL,
}


class _NumpyAdapter:
    """How kolo._ops sees NumPy arrays."""

    @staticmethod
    def kdtype(a):
        if not isinstance(a, np.ndarray):
            raise TypeError("expected a numpy.ndarray, got %s" % type(a).__name__)
        dt = _NP_TO_KOLO.get(a.dtype)  # the common case, once per array per step
        if dt is not None:
            return dt
        # native byte order only: kolo reduces in the host's order
        dt = a.dtype.newbyteorder("=") if a.dtype.byteorder in ("<", ">") and a.dtype.isnative else a.dtype
        try:
            return _NP_TO_KOLO[dt]
        except KeyError:
            raise ValueError("Tensor type %s is not supported by kolo." % a.dtype) from None

    @staticmethod
    def contiguous(a):
        if a.flags.c_contiguous:  # np.require costs ten times this test
            return a
        return np.require(a, requirements="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray

    @staticmethod
    def ptr(a):
        return a.ctypes.data

    @staticmethod
    def shape(a):
        return tuple(a.shape)

    @staticmethod
    def copy_(dst, src):
        np.copyto(dst, src)

    # where outputs are allocated (also the copies from_c makes of the engine's outputs under 1 MiB;
    # larger ones are returned as they are, over()): from 32 MiB blocks kept from step to step, their
    # pages already in memory (kolo._pool)
    empty = staticmethod(_pool.empty_large)

    @staticmethod
    def over(raw, shape, like):
        # raw: the bytes of an output the engine allocated, as uint8 (kolo._ops._output)
        return raw.view(like.dtype).reshape(shape)

    @classmethod
    def from_c(cls, ptr, shape, like):
        out = cls.empty(shape, like.dtype)
        if out.nbytes:
            ctypes.memmove(out.ctypes.data, ptr, out.nbytes)
        return out


_A = _NumpyAdapter
_out_like = _pool.empty_like_large
_shutdown_hooks.append(_pool.outputs.clear)  # the next job may need other sizes


def _writable(a):
    if not a.flags.writeable:
        raise ValueError("the array is read-only; an in-place collective needs a writable array")


def allreduce_async(array, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
                    process_set=global_process_set):  # noqa: F405
    _A.kdtype(array)
    return _ops.allreduce_async(_A, array, _out_like(array), name, op, prescale_factor,
                                postscale_factor, process_set)


def allreduce(array, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
              process_set=global_process_set):  # noqa: F405
    """Returns a new array: op over every rank's array (Average: the sum divided by the
    set's size; integers truncate). prescale/postscale multiply before/after the reduction."""
    return synchronize(allreduce_async(array, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_async_(array, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
                     process_set=global_process_set):  # noqa: F405
    _writable(array)
    return _ops.allreduce_async(_A, array, array, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(array, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
               process_set=global_process_set):  # noqa: F405
    """In place; returns the array."""
    return synchronize(allreduce_async_(array, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(arrays, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
                            process_set=global_process_set):  # noqa: F405
    arrays = list(arrays)
    return _ops.grouped_allreduce_async(_A, arrays, [_out_like(a) for a in arrays], name, op,
                                        prescale_factor, postscale_factor, process_set)


def grouped_allreduce(arrays, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
                      process_set=global_process_set):  # noqa: F405
    """Allreduces a list of arrays as one group (fused into one collective when they fit)."""
    return synchronize(grouped_allreduce_async(arrays, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async_(arrays, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
                             process_set=global_process_set):  # noqa: F405
    arrays = list(arrays)
    for a in arrays:
        _writable(a)
    return _ops.grouped_allreduce_async(_A, arrays, arrays, name, op, prescale_factor, postscale_factor,
                                        process_set)


def grouped_allreduce_(arrays, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,  # noqa: F405
                       process_set=global_process_set):  # noqa: F405
    return synchronize(grouped_allreduce_async_(arrays, name, op, prescale_factor, postscale_factor, process_set))


def allgather_async(array, name=None, process_set=global_process_set):  # noqa: F405
    return _ops.allgather_async(_A, array, name, process_set)


def allgather(array, name=None, process_set=global_process_set):  # noqa: F405
    """Concatenates every rank's array along the first dimension (which may differ per rank)."""
    return synchronize(allgather_async(array, name, process_set))


def grouped_allgather_async(arrays, name=None, process_set=global_process_set):  # noqa: F405
    return _ops.grouped_allgather_async(_A, list(arrays), name, process_set)


def grouped_allgather(arrays, name=None, process_set=global_process_set):  # noqa: F405
    return synchronize(grouped_allgather_async(arrays, name, process_set))


def broadcast_async(array, root_rank, name=None, process_set=global_process_set):  # noqa: F405
    _A.kdtype(array)
    return _ops.broadcast_async(_A, array, _out_like(array), root_rank, name, process_set)


def broadcast(array, root_rank, name=None, process_set=global_process_set):  # noqa: F405
    """Returns root_rank's array on every rank (root_rank is a world rank)."""
    return synchronize(broadcast_async(array, root_rank, name, process_set))


def broadcast_async_(array, root_rank, name=None, process_set=global_process_set):  # noqa: F405
    _writable(array)
    return _ops.broadcast_async(_A, array, array, root_rank, name, process_set)


def broadcast_(array, root_rank, name=None, process_set=global_process_set):  # noqa: F405
    return synchronize(broadcast_async_(array, root_rank, name, process_set))


def alltoall_async(array, splits=None, name=None, process_set=global_process_set):  # noqa: F405
    return _ops.alltoall_async(_A, array, None if splits is None else np.asarray(splits).tolist(), name,
                               process_set)


def alltoall(array, splits=None, name=None, process_set=global_process_set):  # noqa: F405
    """Sends splits[r] first-dimension rows to rank r (None: equal parts). Returns the received
    rows in rank order, and with splits given also the rows received from each rank."""
    out, rsplits = synchronize(alltoall_async(array, splits, name, process_set))
    if splits is None:
        return out
    return out, np.asarray(rsplits, dtype=np.int32)


def reducescatter_async(array, name=None, op=Average, process_set=global_process_set,  # noqa: F405
                        prescale_factor=1.0, postscale_factor=1.0):
    return _ops.reducescatter_async(_A, array, name, op, prescale_factor, postscale_factor, process_set)


def reducescatter(array, name=None, op=Average, process_set=global_process_set,  # noqa: F405
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces every rank's array and leaves each rank its share of the first dimension
    (the first dim % size ranks get one more row)."""
    return synchronize(reducescatter_async(array, name, op, process_set, prescale_factor, postscale_factor))


def grouped_reducescatter_async(arrays, name=None, op=Average, process_set=global_process_set,  # noqa: F405
                                prescale_factor=1.0, postscale_factor=1.0):
    return _ops.grouped_reducescatter_async(_A, list(arrays), name, op, prescale_factor, postscale_factor,
                                            process_set)


def grouped_reducescatter(arrays, name=None, op=Average, process_set=global_process_set,  # noqa: F405
                          prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(grouped_reducescatter_async(arrays, name, op, process_set, prescale_factor,
                                                   postscale_factor))


def join(process_set=global_process_set):  # noqa: F405
    """This rank has no more data: until every rank has joined, the others' allreduces go on with
    zeros from this rank. Returns the last rank to join."""
    return synchronize(_ops.join_async(process_set))


def shared_empty(shape, dtype=np.float32):
    """A zeroed NumPy array in memory the other ranks of this host can map (kolo_mem_alloc).

    When every rank of a one-host job reduces such an array (allreduce_) and it holds more than
    64 KiB, the ranks read and write each other's arrays directly instead of copying through
    shared-memory rings: every byte crosses memory once (64 MiB, 2 ranks: 2.5x as fast).
    torch.from_numpy() of it shares the memory. Works before init(); the memory is freed when the
    last view of the array is gone."""
    dt = np.dtype(dtype)
    if any(int(d) < 0 for d in np.atleast_1d(shape)):
        raise ValueError("kolo.shared_empty(%r): negative dimension" % (shape,))
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = max(count * dt.itemsize, 1)
    p = _lib.kolo_mem_alloc(nbytes)
    if not p:
        raise MemoryError("kolo.shared_empty(%r, %s): %s" % (shape, dt, _lib.last_error()))
    buf = (ctypes.c_char * nbytes).from_address(p)
    weakref.finalize(buf, _lib.kolo_mem_free, p)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)


def barrier(process_set=global_process_set):  # noqa: F405
    """Returns once every rank of the set has entered it."""
    synchronize(_ops.barrier_async(process_set))


__all__ = list(_basics_all) + [
    "__version__", "poll", "synchronize", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier",
    "shared_empty", "run",
    "HorovodInternalError", "HostsUpdatedInterrupt", "KoloVersionMismatchError"]
