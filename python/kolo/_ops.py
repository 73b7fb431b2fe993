"""The collectives, written once for every framework.

Each framework binding (kolo for NumPy, kolo.torch) gives an adapter that knows its arrays:
their kolo dtype, a contiguous view or copy, the address of their memory, and how to make a
new array. The functions here submit requests to libkolo's engine (kolo_i* in kolo.h) and
return integer handles; poll() and synchronize() complete them.

Lifetime rule: the engine reads and writes the buffers of a request on its own thread until
the request completes, so every buffer handed to C is kept in the handle's `keep` tuple until
synchronize() has seen the request complete (also when it failed: a failed group is waited
for in full before anything is let go).

Without the engine (an older libkolo, or KOLO_PYTHON_DIRECT=1), the same functions run the
blocking direct collectives at submission and the handle is complete at once.
"""

import ctypes
import itertools
import threading

import numpy as np

from kolo import _lib
from kolo.basics import c_op, _pset_id, _shutdown_hooks, global_process_set, Average

_EMPTY = ctypes.create_string_buffer(16)  # stands in for the address of a zero-element array


def _addr(p):
    return p if p else ctypes.addressof(_EMPTY)


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


# Submitting costs microseconds per tensor, most of them Python's, and a framework submits one
# request per gradient every step. libkolo copies the shape and reads the options during the call
# only, so the C structs of the shapes and process sets seen are built once and shared (read-only).
_SHAPES = {}
_SHAPES_MAX = 4096  # distinct shapes kept; a model has far fewer, a stream of odd shapes stops adding
_OPTS = {}


def _cshape(shape):
    s = _SHAPES.get(shape)
    if s is not None:
        return s
    if len(shape) > _lib.MAX_DIMS:
        raise ValueError("kolo supports tensors of at most %d dimensions, not %d" % (_lib.MAX_DIMS, len(shape)))
    s = _lib.Shape()
    s.ndim = len(shape)
    for i, d in enumerate(shape):
        s.dims[i] = int(d)
    if len(_SHAPES) < _SHAPES_MAX:
        _SHAPES[tuple(shape)] = s
    return s


def _opts(pset):
    o = _OPTS.get(pset)
    if o is None:
        o = _lib.SubmitOpts()
        o.process_set = pset
        _OPTS[pset] = o
    return o


def _full_name(prefix, name):
    return None if name is None else ("%s.%s" % (prefix, name)).encode()


# ---- requests: the engine's, or a completed stand-in for the direct collectives ----

class _EngineReq:
    __slots__ = ("p",)

    def __init__(self, p):
        self.p = p

    def test(self):
        done = ctypes.c_int(0)
        _lib.kolo_request_test(self.p, ctypes.byref(done))
        return bool(done.value)

    def wait(self):
        # Waits in slices so that Ctrl-C (handled between Python bytecodes) is not held off.
        while True:
            st = _lib.kolo_request_wait(self.p, 1.0)
            if st != _lib.ERR_TIMEOUT or _lib.kolo_request_status(self.p) != 1:
                return st

    def error(self):
        return (_lib.kolo_request_error(self.p) or b"").decode("utf-8", "replace")

    def output(self):
        data = ctypes.c_void_p()
        shape = _lib.Shape()
        _lib.check(_lib.kolo_request_output(self.p, ctypes.byref(data), ctypes.byref(shape)))
        return data.value, tuple(shape.dims[i] for i in range(shape.ndim))

    def splits(self, n):
        arr = (ctypes.c_int64 * max(1, n))()
        _lib.check(_lib.kolo_request_splits(self.p, arr, n))
        return [int(arr[i]) for i in range(n)]

    def last_rank(self):
        return _lib.kolo_request_join_last_rank(self.p)

    def release(self):
        if self.p:
            _lib.kolo_request_release(self.p)
            self.p = None

    def take(self):
        """The request, now the caller's to release (release() leaves it alone)."""
        p, self.p = self.p, None
        return p


class _COutput:
    """An output the engine allocated, as the memory of the array or tensor returned: the request
    is released, and its block goes back to the engine for its next output (request.c), when the
    last array over it goes. Copying it out cost a pass over the output at every call."""
    __slots__ = ("__array_interface__", "_p")

    def __init__(self, p, ptr, nbytes):
        self._p = p
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    def __del__(self):
        try:
            _lib.kolo_request_release(self._p)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


TAKEN_MIN = 1 << 20  # the engine's outputs from this size are aligned and kept (request.c)


def _output(A, req, like, dt):
    """The output of a completed allgather, alltoall or reducescatter: from 1 MiB the engine's own
    memory (the adapter's over()), below that or without the engine a copy (from_c)."""
    ptr, shape = req.output()
    nbytes = _numel(shape) * _lib.DTYPE_SIZES[dt]
    if isinstance(req, _EngineReq) and nbytes >= TAKEN_MIN and ptr % 64 == 0:
        return A.over(np.asarray(_COutput(req.take(), ptr, nbytes)), shape, like)
    return A.from_c(ptr, shape, like)


class _DoneReq:
    """A request that completed during submission (direct collectives)."""
    __slots__ = ("status", "msg", "buf", "shape", "rsplits", "last")

    def __init__(self, status, msg="", buf=None, shape=None, rsplits=None, last=-1):
        self.status, self.msg, self.buf, self.shape, self.rsplits, self.last = status, msg, buf, shape, rsplits, last

    def test(self):
        return True

    def wait(self):
        return self.status

    def error(self):
        return self.msg

    def output(self):
        return (ctypes.addressof(self.buf) if self.buf is not None else None), self.shape

    def splits(self, n):
        return list(self.rsplits)

    def last_rank(self):
        return self.last

    def release(self):
        self.buf = None


def _direct(st, **kw):
    if st == _lib.OK:
        return _DoneReq(st, **kw)
    msg = _lib.last_error()
    if st in (_lib.ERR_INVALID_ARG, _lib.ERR_NOT_INITIALIZED, _lib.ERR_NOT_MEMBER, _lib.ERR_NO_MEMORY):
        raise _lib.error_for(st, msg)
    return _DoneReq(st, msg)


def _engine(f, *args):
    req = ctypes.c_void_p()
    st = f(*args, ctypes.byref(req))
    if st != _lib.OK:
        raise _lib.error_for(st, _lib.last_error())
    return _EngineReq(req.value)


# ---- handles ----

class _Op:
    __slots__ = ("reqs", "keep", "finish")

    def __init__(self, reqs, keep, finish):
        self.reqs, self.keep, self.finish = reqs, keep, finish


_handles = {}
_orphans = []  # operations abandoned while pending: their buffers live until shutdown
_counter = itertools.count(1)
_hlock = threading.Lock()


def _register(reqs, keep, finish):
    with _hlock:
        h = next(_counter)
        _handles[h] = _Op(reqs, keep, finish)
    return h


def _drop_all():
    # After kolo_shutdown every pending request has completed (with KOLO_ERR_SHUT_DOWN),
    # so the buffers may go.
    with _hlock:
        ops = list(_handles.values()) + _orphans
        _handles.clear()
        del _orphans[:]
    for op in ops:
        for r in op.reqs:
            r.release()


_shutdown_hooks.append(_drop_all)


def poll(handle):
    """True when the operation behind handle has completed (synchronize() will not block)."""
    op = _handles.get(handle)
    if op is None:
        raise ValueError("handle %r was not created or has been synchronized already" % (handle,))
    return all(r.test() for r in op.reqs)


def synchronize(handle):
    """Waits for the operation and returns its output. Raises HorovodInternalError (a
    RuntimeError) with kolo's message when it failed. An unknown handle returns None."""
    op = _handles.get(handle)
    if op is None:
        return None
    done = False
    try:
        first_err = None
        for r in op.reqs:  # wait for every request, even after a failure: they own buffers
            st = r.wait()
            if st != _lib.OK and first_err is None:
                first_err = (st, r.error())
        if first_err is not None:
            st, msg = first_err
            e = _lib.error_for(st, msg)
            if isinstance(e, ValueError):
                # Horovod turns every failure seen in synchronize into HorovodInternalError.
                e = _lib.HorovodInternalError(str(e))
                e.status = st
            raise e
        done = True  # every wait returned: nothing is pending
        return op.finish(op.reqs)
    finally:
        with _hlock:
            _handles.pop(handle, None)
            pending = not done and not all(r.test() for r in op.reqs)
            if pending:
                # Interrupted (Ctrl-C) while the engine may still use the buffers: keep them
                # alive until shutdown rather than free memory that C is writing.
                _orphans.append(op)
        if not pending:
            for r in op.reqs:
                r.release()


# ---- submissions ----

def allreduce_async(A, tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                    prefix="allreduce"):
    """output is tensor for the in-place variant."""
    cop = c_op(op)
    pid = _pset_id(process_set)
    dt = A.kdtype(tensor)
    src = A.contiguous(tensor)
    if output is tensor:
        dst = src
    else:
        dst = output
    shape = A.shape(src)
    sp = _addr(A.ptr(src))
    dp = sp if dst is src else _addr(A.ptr(dst))  # a NumPy array's address costs 0.8 us
    if _lib.HAVE_ENGINE:
        cs = _cshape(shape)
        req = _engine(_lib.kolo_iallreduce, _full_name(prefix, name), sp, dp, dt, ctypes.byref(cs), cop,
                      float(prescale_factor), float(postscale_factor), ctypes.byref(_opts(pid)))
    else:
        req = _direct(_lib.kolo_allreduce(sp, dp, _numel(shape), dt, cop, float(prescale_factor),
                                          float(postscale_factor), pid))

    def finish(reqs):
        if dst is not output:
            A.copy_(output, dst)
        return output
    return _register([req], (tensor, src, dst, output), finish)


def grouped_allreduce_async(A, tensors, outputs, name, op, prescale_factor, postscale_factor, process_set):
    """outputs is tensors for the in-place variant. One group per dtype (kolo's grouped
    requests carry one dtype)."""
    cop = c_op(op)
    pid = _pset_id(process_set)
    n = len(tensors)
    if n == 0:
        return _register([], (), lambda reqs: [])
    inplace = outputs is tensors
    srcs = [A.contiguous(t) for t in tensors]
    dsts = srcs if inplace else list(outputs)
    dts = [A.kdtype(t) for t in tensors]
    if name is not None:
        names = [("grouped_allreduce.%s_%dof%d" % (name, i + 1, n)).encode() for i in range(n)]
    else:
        names = None
    reqs = []
    for dt in sorted(set(dts)):
        idx = [i for i in range(n) if dts[i] == dt]
        if _lib.HAVE_ENGINE:
            k = len(idx)
            cnames = (ctypes.c_char_p * k)(*[names[i] for i in idx]) if names else None
            sends = (ctypes.c_void_p * k)(*[_addr(A.ptr(srcs[i])) for i in idx])
            recvs = (ctypes.c_void_p * k)(*[_addr(A.ptr(dsts[i])) for i in idx])
            shapes = (_lib.Shape * k)(*[_cshape(A.shape(srcs[i])) for i in idx])
            out = (ctypes.c_void_p * k)()
            st = _lib.kolo_igrouped_allreduce(k, cnames, sends, recvs, dt, shapes, cop, float(prescale_factor),
                                              float(postscale_factor), ctypes.byref(_opts(pid)), out)
            if st != _lib.OK:
                err = _lib.error_for(st, _lib.last_error())
                # what was submitted already must complete before its buffers may go
                for r in reqs:
                    r.wait()
                    r.release()
                raise err
            reqs += [_EngineReq(out[j]) for j in range(k)]
        else:
            for i in idx:
                reqs.append(_direct(_lib.kolo_allreduce(_addr(A.ptr(srcs[i])), _addr(A.ptr(dsts[i])),
                                                        _numel(A.shape(srcs[i])), dt, cop, float(prescale_factor),
                                                        float(postscale_factor), pid)))
    results = list(outputs)

    def finish(reqs_):
        for o, d in zip(results, dsts):
            if d is not o:
                A.copy_(o, d)
        return results
    return _register(reqs, (tensors, srcs, dsts, results), finish)


def _gather_counts(values, pid, nranks):
    """Direct allgather of one int64 per rank."""
    mine = (ctypes.c_int64 * 1)(values)
    out = (ctypes.c_int64 * nranks)()
    _lib.check(_lib.kolo_allgather(mine, 1, out, None, _lib.INT64, pid))
    return list(out)


def _set_size(pid):
    v = ctypes.c_int()
    _lib.check(_lib.kolo_process_set_size(pid, ctypes.byref(v)))
    return v.value


def _set_rank(pid):
    v = ctypes.c_int()
    _lib.check(_lib.kolo_process_set_rank(pid, ctypes.byref(v)))
    return v.value


def allgather_async(A, tensor, name, process_set, prefix="allgather"):
    pid = _pset_id(process_set)
    dt = A.kdtype(tensor)
    src = A.contiguous(tensor)
    shape = A.shape(src)
    if len(shape) == 0:
        raise ValueError("allgather needs a tensor of at least one dimension (it concatenates along the "
                         "first); got a scalar")
    if _lib.HAVE_ENGINE:
        cs = _cshape(shape)
        req = _engine(_lib.kolo_iallgather, _full_name(prefix, name), _addr(A.ptr(src)), dt, ctypes.byref(cs),
                      ctypes.byref(_opts(pid)))
    else:
        n = _set_size(pid)
        rows = _gather_counts(shape[0], pid, n)
        row = _numel(shape[1:])
        counts = (ctypes.c_size_t * n)(*[r * row for r in rows])
        buf = ctypes.create_string_buffer(max(1, sum(rows) * row * _lib.DTYPE_SIZES[dt]))
        st = _lib.kolo_allgather(_addr(A.ptr(src)), shape[0] * row, buf, counts, dt, pid)
        req = _direct(st, buf=buf, shape=(sum(rows),) + tuple(shape[1:]))

    def finish(reqs):
        return _output(A, reqs[0], tensor, dt)
    return _register([req], (tensor, src), finish)


def grouped_allgather_async(A, tensors, name, process_set):
    n = len(tensors)
    subs = []
    for i, t in enumerate(tensors):
        nm = None if name is None else "%s_%dof%d" % (name, i + 1, n)
        subs.append(allgather_async(A, t, nm, process_set, prefix="grouped_allgather"))
    return _combine(subs)


def _combine(handles):
    """One handle over several: its result is the list of their results."""
    with _hlock:
        ops = [_handles.pop(h) for h in handles]
    reqs = [r for op in ops for r in op.reqs]
    keep = tuple(op.keep for op in ops)

    def finish(reqs_):
        out, i = [], 0
        for op in ops:
            k = len(op.reqs)
            out.append(op.finish(reqs_[i:i + k]))
            i += k
        return out
    return _register(reqs, keep, finish)


def broadcast_async(A, tensor, output, root_rank, name, process_set, prefix="broadcast"):
    """root_rank is a world rank (as in Horovod). output is tensor for the in-place variant."""
    ps = process_set if process_set is not None else global_process_set
    pid = _pset_id(ps)
    root = ps.set_rank_of(root_rank) if pid != 0 else int(root_rank)
    dt = A.kdtype(tensor)
    if output is tensor:
        buf = A.contiguous(tensor)
    else:
        buf = output
        A.copy_(buf, tensor)
    shape = A.shape(buf)
    if _lib.HAVE_ENGINE:
        cs = _cshape(shape)
        req = _engine(_lib.kolo_ibroadcast, _full_name(prefix, name), _addr(A.ptr(buf)), dt, ctypes.byref(cs),
                      root, ctypes.byref(_opts(pid)))
    else:
        req = _direct(_lib.kolo_broadcast(_addr(A.ptr(buf)), _numel(shape), dt, root, pid))

    def finish(reqs):
        if buf is not output:
            A.copy_(output, buf)
        return output
    return _register([req], (tensor, buf, output), finish)


def alltoall_async(A, tensor, splits, name, process_set, prefix="alltoall"):
    """splits: None (even division of the first dimension) or a sequence of row counts, one
    per rank of the set. The result is (output, received_splits as a list)."""
    pid = _pset_id(process_set)
    dt = A.kdtype(tensor)
    src = A.contiguous(tensor)
    shape = A.shape(src)
    if len(shape) == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension; got a scalar")
    n = _set_size(pid)
    if splits is not None:
        splits = [int(s) for s in splits]
        if len(splits) != n:
            raise ValueError("alltoall: splits has %d entries; the process set has %d ranks" % (len(splits), n))
        if any(s < 0 for s in splits) or sum(splits) != shape[0]:
            raise ValueError("alltoall: splits %s must be non-negative and sum to the first dimension %d"
                             % (splits, shape[0]))
    elif shape[0] % n != 0:
        raise ValueError("alltoall without splits needs the first dimension (%d) to be divisible by the "
                         "number of ranks (%d)" % (shape[0], n))
    if _lib.HAVE_ENGINE:
        cs = _cshape(shape)
        csplits = (ctypes.c_int64 * n)(*splits) if splits is not None else None
        req = _engine(_lib.kolo_ialltoall, _full_name(prefix, name), _addr(A.ptr(src)), dt, ctypes.byref(cs),
                      csplits, ctypes.byref(_opts(pid)))
        keep = (tensor, src, csplits)
    else:
        sp = splits if splits is not None else [shape[0] // n] * n
        row = _numel(shape[1:])
        ones = (ctypes.c_size_t * n)(*([1] * n))
        mine = (ctypes.c_int64 * n)(*sp)
        got = (ctypes.c_int64 * n)()
        _lib.check(_lib.kolo_alltoall(mine, ones, got, ones, _lib.INT64, pid))
        rs = list(got)
        buf = ctypes.create_string_buffer(max(1, sum(rs) * row * _lib.DTYPE_SIZES[dt]))
        sc = (ctypes.c_size_t * n)(*[s * row for s in sp])
        rc = (ctypes.c_size_t * n)(*[s * row for s in rs])
        st = _lib.kolo_alltoall(_addr(A.ptr(src)), sc, buf, rc, dt, pid)
        req = _direct(st, buf=buf, shape=(sum(rs),) + tuple(shape[1:]), rsplits=rs)
        keep = (tensor, src)

    def finish(reqs):
        return _output(A, reqs[0], tensor, dt), reqs[0].splits(n)
    return _register([req], keep, finish)


def reducescatter_async(A, tensor, name, op, prescale_factor, postscale_factor, process_set,
                        prefix="reducescatter"):
    cop = c_op(op)
    pid = _pset_id(process_set)
    dt = A.kdtype(tensor)
    src = A.contiguous(tensor)
    shape = A.shape(src)
    if len(shape) == 0:
        raise ValueError("Reducescatter does not support scalar inputs")
    if _lib.HAVE_ENGINE:
        cs = _cshape(shape)
        req = _engine(_lib.kolo_ireducescatter, _full_name(prefix, name), _addr(A.ptr(src)), dt,
                      ctypes.byref(cs), cop, float(prescale_factor), float(postscale_factor),
                      ctypes.byref(_opts(pid)))
    else:
        n, r = _set_size(pid), _set_rank(pid)
        row = _numel(shape[1:])
        mine = _lib.kolo_reducescatter_rows(shape[0], n, r)
        buf = ctypes.create_string_buffer(max(1, mine * row * _lib.DTYPE_SIZES[dt]))
        st = _lib.kolo_reducescatter(_addr(A.ptr(src)), buf, shape[0], row, dt, cop, float(prescale_factor),
                                     float(postscale_factor), pid)
        req = _direct(st, buf=buf, shape=(mine,) + tuple(shape[1:]))

    def finish(reqs):
        return _output(A, reqs[0], tensor, dt)
    return _register([req], (tensor, src), finish)


def grouped_reducescatter_async(A, tensors, name, op, prescale_factor, postscale_factor, process_set):
    n = len(tensors)
    subs = []
    for i, t in enumerate(tensors):
        nm = None if name is None else "%s_%dof%d" % (name, i + 1, n)
        subs.append(reducescatter_async(A, t, nm, op, prescale_factor, postscale_factor, process_set,
                                        prefix="grouped_reducescatter"))
    return _combine(subs)


def join_async(process_set=None):
    pid = _pset_id(process_set)
    if not _lib.HAVE_ENGINE:
        raise NotImplementedError("join() needs kolo's engine, which this libkolo lacks (or "
                                  "KOLO_PYTHON_DIRECT=1 is set)")
    req = _engine(_lib.kolo_ijoin, ctypes.byref(_opts(pid)))
    return _register([req], (), lambda reqs: reqs[0].last_rank())


def barrier_async(process_set=None):
    pid = _pset_id(process_set)
    if _lib.HAVE_ENGINE:
        req = _engine(_lib.kolo_ibarrier, ctypes.byref(_opts(pid)))
    else:
        req = _direct(_lib.kolo_barrier(pid))
    return _register([req], (), lambda reqs: None)


__all__ = ["poll", "synchronize", "Average"]
