"""kolo.tensorflow's collectives on TensorFlow tensors, with Horovod's names, signatures and gradients
(horovod/tensorflow/mpi_ops.py). Nothing is compiled against TensorFlow.

How a collective runs:
  * eagerly, the tensors' memory goes to kolo._ops as NumPy arrays, the requests are submitted to
    kolo's engine and waited for, and the outputs come back as new tensors;
  * inside tf.function, the same Python function becomes one op through tf.numpy_function
    (stateful: never pruned, folded or duplicated), with the static output shapes set where they are
    known. tf.function's automatic control dependencies run stateful ops in program order, so every
    rank reaches its collectives in the same order, and an op that waits inside numpy_function never
    waits for one that its peer has not reached. XLA cannot compile such an op: under
    jit_compile=True kolo refuses at trace time with an error that says so.
A batch (the gradients of one step, the variables of one broadcast) is one op: every request is
submitted before the first wait, so the engine negotiates and fuses them together.

Names: a named op is "<kind>.<name>" on every rank (not prefixed by the name scope). An unnamed op
is numbered per process when eager ("allreduce.noname.<n>": issue those in the same order on every
rank); inside tf.function it is named after its input's graph name, as Horovod does, which the graph
makes unique and which is the same on every rank and at every step (so the engine's response cache
keeps it).

A graph built outside tf.function (TensorFlow 1 style, for a tf.compat.v1.Session) is refused: a
session runs independent ops in any order, and a collective waits in the thread that runs it.

Errors carry kolo's message. Eagerly each is kolo's exception and Horovod's tf.errors class at once
(FailedPreconditionError + HorovodInternalError when ranks disagree, UnknownError +
HorovodInternalError for a lost peer and the like, InvalidArgumentError + ValueError for a bad call);
inside tf.function TensorFlow turns kolo's exception into a tf.errors.OpError (UnknownError, or
InvalidArgumentError for ValueError) whose message carries kolo's.
"""

import re

import numpy as np
import tensorflow as tf

import kolo
from kolo import _lib, _ops, _pool
from kolo.basics import (Average, Sum, Adasum, Min, Max, Product, _elastic, c_op,  # noqa: F401
                         global_process_set, rank)
from kolo.exceptions import HorovodInternalError
from kolo.tensorflow.compression import Compression

try:  # TensorFlow's own bfloat16 NumPy type (ml_dtypes in TF >= 2.12)
    _BF16 = np.dtype(tf.bfloat16.as_numpy_dtype)
except TypeError:  # pragma: no cover - depends on the TensorFlow release
    _BF16 = None

_SUPPORTED = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
              tf.float32, tf.float64, tf.bool)


class _TFArrays(kolo._NumpyAdapter):
    """How kolo._ops sees the arrays of TensorFlow tensors: NumPy's, plus TensorFlow's bfloat16."""

    @staticmethod
    def kdtype(a):
        if _BF16 is not None and isinstance(a, np.ndarray) and a.dtype == _BF16:
            return _lib.BFLOAT16
        return kolo._NumpyAdapter.kdtype(a)

    # every output allocated here into a kept, aligned block, which TensorFlow takes as the tensor's
    # memory (the engine's own outputs from 1 MiB are such blocks already: kolo._ops._output)
    empty = staticmethod(_pool.outputs.empty)


_A = _TFArrays
# Outputs come from kolo._pool: aligned as TensorFlow needs to take them as tensors' memory (inside
# tf.function, and eagerly through DLPack) instead of copying them, and kept from step to step so
# their pages are not faulted in again (docs/tensorflow.md, "Outputs are not copied").
_out_like = _pool.outputs.empty_like

try:
    _from_dlpack = tf.experimental.dlpack.from_dlpack
except AttributeError:  # pragma: no cover - depends on the TensorFlow release
    _from_dlpack = None


def _to_tensor(a, dtype):
    """An output array as an eager tensor: its memory itself, through DLPack, when it starts on a
    64-byte boundary, as kolo._pool's blocks and the engine's own outputs from 1 MiB do (TensorFlow
    aborts the process on unaligned DLPack memory, so nothing else goes that way); a copy otherwise.
    The tensor holds the array, and so the block, until it goes. 161 outputs of 640 KB: 0.3 ms
    against 35 ms for tf.convert_to_tensor's copies."""
    if (_from_dlpack is not None and isinstance(a, np.ndarray) and a.size and a.flags.c_contiguous
            and a.ctypes.data % _pool.ALIGN == 0 and a.dtype != _BF16 and tf.as_dtype(a.dtype) == dtype):
        try:
            return _from_dlpack(a.__dlpack__())
        except (AttributeError, BufferError, TypeError):  # an older NumPy; a dtype DLPack lacks
            pass
    return tf.convert_to_tensor(a, dtype=dtype)  # (bfloat16: DLPack has no NumPy bfloat16)


# ---- batches: several collectives submitted together, then waited for ----

class _Spec:
    """One collective of a batch: it takes `nin` arrays, submit(*arrays) returns the list of its
    kolo handles, and finish(results, *arrays) turns their results into its output arrays."""
    __slots__ = ("nin", "submit", "finish")

    def __init__(self, nin, submit, finish=None):
        self.nin, self.submit = nin, submit
        self.finish = finish or (lambda results, *ins: [results[0]])


def _run(specs, arrays):
    """Submits every spec, then waits for every handle (also after a failure: the engine owns the
    buffers until then), then raises the first error or returns all the output arrays."""
    arrays = [np.asarray(a) for a in arrays]  # a 0-d tensor may come as a NumPy scalar
    submitted, err, pos = [], None, 0
    for s in specs:
        ins = arrays[pos:pos + s.nin]
        pos += s.nin
        try:
            submitted.append((s, ins, s.submit(*ins)))
        except BaseException as e:  # what was submitted still completes below
            err = e
            break
    done = []
    for s, ins, handles in submitted:
        results = []
        for h in handles:
            try:
                results.append(_ops.synchronize(h))
            except BaseException as e:
                err = err or e
        done.append((s, ins, results))
    if err is not None:
        raise err
    out = []
    for s, ins, results in done:
        out.extend(s.finish(results, *ins))
    return out


def _eager_array(t):
    # EagerTensor._numpy() is a view of the tensor's memory; .numpy() would copy it.
    f = getattr(t, "_numpy", None)
    return f() if f is not None else t.numpy()


def _refuse_xla(what):
    try:
        from tensorflow.python.ops import control_flow_util
        xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        xla = False
    if xla:
        raise NotImplementedError(
            "kolo.tensorflow.%s cannot run under XLA (tf.function(jit_compile=True), or Keras "
            "compile(jit_compile=True)): kolo's collectives are tf.numpy_function ops, which XLA cannot "
            "compile. Use jit_compile=False." % what)


def _refuse_tf1(what):
    """Refuses a graph built outside tf.function: TensorFlow 1 style, after
    tf.compat.v1.disable_eager_execution() or under `with tf.Graph().as_default()`, run by a
    tf.compat.v1.Session. Each collective waits for its peers in the thread that runs it, and a
    session runs independent ops in any order on a few threads, so ranks that started different
    collectives would wait for each other forever (tf.function's automatic control dependencies
    are what order them)."""
    if not tf.compat.v1.executing_eagerly_outside_functions():
        raise NotImplementedError(
            "kolo.tensorflow.%s: TensorFlow 1 graphs (tf.compat.v1.disable_eager_execution(), or a tf.Graph "
            "run by a tf.compat.v1.Session) are not supported: a session runs independent collectives in any "
            "order, and ranks that started different ones would wait for each other forever. Call kolo's "
            "collectives eagerly or inside tf.function, which runs them in program order." % what)


# Eagerly, kolo's exceptions are also the tf.errors classes Horovod raises. TensorFlow's class comes
# first in the bases, so that its __init__(node_def, op, message) builds them.

class FailedPreconditionError(tf.errors.FailedPreconditionError, HorovodInternalError):
    """Ranks disagreed on a collective (shapes, dtypes, ops, names)."""


class UnknownError(tf.errors.UnknownError, HorovodInternalError):
    """A collective failed otherwise (a lost or stalled peer, kolo shut down), as inside tf.function."""


class InvalidArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """A bad call, refused before anything was sent (as inside tf.function)."""


def _as_op_error(e):
    """kolo's exception e as the tf.errors.OpError Horovod raises for it eagerly, still an instance of
    kolo's class; None when it has no such counterpart."""
    if isinstance(e, HorovodInternalError):
        cls = FailedPreconditionError if getattr(e, "status", None) == _lib.ERR_MISMATCH else UnknownError
    elif type(e) is ValueError:
        cls = InvalidArgumentError
    else:
        return None
    new = cls(None, None, str(e))
    new.status = getattr(e, "status", None)
    return new


def _execute(specs, tensors, out_dtypes, out_shapes, what):
    """Runs a batch over tensors; returns the list of output tensors (static shapes set)."""
    if tf.executing_eagerly():
        try:
            outs = _run(specs, [_eager_array(t) for t in tensors])
        except (HorovodInternalError, ValueError) as e:
            new = _as_op_error(e)
            if new is None:
                raise
            raise new.with_traceback(e.__traceback__) from None
        return [_to_tensor(o, d) for o, d in zip(outs, out_dtypes)]
    _refuse_tf1(what)
    _refuse_xla(what)
    outs = tf.numpy_function(lambda *a: _run(specs, a), list(tensors), list(out_dtypes), stateful=True,
                             name="Kolo" + what.title().replace("_", ""))
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for o, s in zip(outs, out_shapes):
        if s is not None:
            o.set_shape(s)
    return outs


# ---- arguments ----

def check_dtype(tensor, what):
    if tensor.dtype.base_dtype not in _SUPPORTED:
        raise ValueError("kolo.tensorflow.%s: Tensor type %s is not supported; kolo reduces %s." % (
            what, tensor.dtype.name, ", ".join(d.name for d in _SUPPORTED)))


def _op_of(op, average):
    """Horovod's deprecated average= argument next to op=."""
    if average is None:
        return Average if op is None else op
    if op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    return Average if average else Sum


def _tensor(x, what):
    t = tf.convert_to_tensor(x)
    check_dtype(t, what)
    return t


_ADASUM_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _check_op(op, what, tensors=()):
    """Refuses an unknown op, and what libkolo would refuse only when the op runs (inside
    tf.function, as an InvalidArgumentError): Adasum is for allreduce, of floating-point tensors."""
    c_op(op)
    if op != Adasum:
        return
    if what not in ("allreduce", "grouped_allreduce"):
        raise ValueError("kolo.tensorflow.%s: op=Adasum is defined for allreduce only" % what)
    for t in tensors:
        if t.dtype.base_dtype not in _ADASUM_DTYPES:
            raise ValueError("kolo.tensorflow.%s: op=Adasum is defined for floating-point tensors only (%s), not %s"
                             % (what, ", ".join(d.name for d in _ADASUM_DTYPES), t.dtype.name))


def _name(name, kind, tensor):
    """The op's name: the given one; eagerly None (kolo numbers it); in a graph, one made from the
    input's graph name, unique in that graph."""
    if name is not None or tf.executing_eagerly():
        return name
    base = re.sub(r"[^A-Za-z0-9_.\-]", "_", tensor.name)
    return tf.compat.v1.get_default_graph().unique_name("Kolo%s_%s" % (kind, base))


def _pset(process_set):
    return global_process_set if process_set is None else process_set


def _size_as(process_set, dtype):
    """process_set's size as a `dtype` tensor, to divide by. In a graph of an elastic job it is read
    when the graph runs, not when it is traced: a later round of the job may have another size."""
    if _elastic() and not tf.executing_eagerly():
        return tf.cast(size_op(process_set.process_set_id), dtype)
    return tf.cast(process_set.size(), dtype)


def _differentiable(inputs, forward, backward):
    """forward(*inputs) -> tuple of outputs, with backward(*output_grads) -> tuple of input grads as
    their gradient. Inputs of integer or bool dtypes have none (TensorFlow does not differentiate
    them), so then forward runs as it is."""
    if not all(t.dtype.is_floating for t in inputs):
        return forward(*inputs)

    @tf.custom_gradient
    def f(*xs):
        def grad(*dys):
            return backward(*dys)
        return forward(*xs), grad
    return f(*inputs)


# ---- the raw collectives (one op each, no gradient) ----

def _allreduce_spec(name, op, prescale_factor, postscale_factor, process_set):
    return _Spec(1, lambda x: [_ops.allreduce_async(_A, x, _out_like(x), name, op, prescale_factor,
                                                    postscale_factor, process_set)])


def _grouped_allreduce_spec(n, name, op, prescale_factor, postscale_factor, process_set):
    def submit(*xs):
        return [_ops.grouped_allreduce_async(_A, list(xs), [_out_like(x) for x in xs], name, op,
                                             prescale_factor, postscale_factor, process_set)]
    return _Spec(n, submit, lambda results, *xs: list(results[0]))


def _allreduce_raw(tensors, names, op, prescale_factor, postscale_factor, process_set, grouped=False):
    """Allreduces a list of tensors in one batch: each in its own request (named names[i]), or, when
    grouped, in one grouped request named names (a string or None)."""
    if grouped:
        specs = [_grouped_allreduce_spec(len(tensors), names, op, prescale_factor, postscale_factor, process_set)]
    else:
        specs = [_allreduce_spec(nm, op, prescale_factor, postscale_factor, process_set) for nm in names]
    return _execute(specs, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "allreduce")


def _allgather_raw(tensors, names, process_set):
    specs = [_Spec(1, lambda x, nm=nm: [_ops.allgather_async(_A, x, nm, process_set)]) for nm in names]
    shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else None for t in tensors]
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("allgather needs a tensor of at least one dimension (it concatenates along the "
                             "first); got a scalar")
    return _execute(specs, tensors, [t.dtype for t in tensors], shapes, "allgather")


def _broadcast_raw(tensors, names, root_rank, process_set):
    specs = [_Spec(1, lambda x, nm=nm: [_ops.broadcast_async(_A, x, _out_like(x), root_rank, nm, process_set)])
             for nm in names]
    return _execute(specs, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "broadcast")


def _alltoall_raw(tensor, splits, name, process_set):
    """splits: None or an int32 tensor. Returns (output, received_splits)."""
    def submit(x, s=None):
        return [_ops.alltoall_async(_A, x, None if s is None else s.reshape(-1).tolist(), name, process_set)]

    def finish(results, *ins):
        out, rsplits = results[0]
        return [out, np.asarray(rsplits, dtype=np.int32)]
    ins = [tensor] if splits is None else [tensor, splits]
    n = process_set.size()
    out_shape = tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None
    return _execute([_Spec(len(ins), submit, finish)], ins, [tensor.dtype, tf.int32], [out_shape, [n]], "alltoall")


def _reducescatter_shape(tensor, process_set):
    if tensor.shape.rank is None or tensor.shape[0] is None:
        return None
    rows = _lib.kolo_reducescatter_rows(int(tensor.shape[0]), process_set.size(), process_set.rank())
    return tf.TensorShape([rows]).concatenate(tensor.shape[1:])


def _reducescatter_raw(tensors, names, op, prescale_factor, postscale_factor, process_set):
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("Reducescatter does not support scalar inputs")
    specs = [_Spec(1, lambda x, nm=nm: [_ops.reducescatter_async(_A, x, nm, op, prescale_factor, postscale_factor,
                                                                   process_set)]) for nm in names]
    return _execute(specs, tensors, [t.dtype for t in tensors],
                    [_reducescatter_shape(t, process_set) for t in tensors], "reducescatter")


def _allgather_grad_raw(grad, rows, process_set):
    """This rank's rows of the averaged gradient of an allgather whose input had `rows` rows."""
    gname = _name(None, "AllgatherGrad", grad)
    rname = None if gname is None else gname + ".rows"

    def submit(dy, r):
        return [_ops.allreduce_async(_A, dy, _out_like(dy), gname, Average, 1.0, 1.0, process_set),
                _ops.allgather_async(_A, r, rname, process_set)]

    def finish(results, dy, r):
        reduced, every = results
        mine = process_set.rank()
        start = int(every[:mine].sum())
        return [np.ascontiguousarray(reduced[start:start + int(r[0])])]
    return _execute([_Spec(2, submit, finish)], [grad, rows], [grad.dtype], [None], "allgather")[0]


# ---- Horovod's API ----

def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Returns op over every rank's tensor (Average, the default: the sum divided by the process set's
    size; integers truncate). prescale/postscale multiply before/after the reduction. A
    tf.IndexedSlices travels as two allgathers (values and indices), as in Horovod. Differentiable:
    the gradient is the allreduce of the gradient, with the same op and factors."""
    op = _op_of(op, average)
    process_set = _pset(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, op, compression, name, process_set)
    tensor = _tensor(tensor, "allreduce")
    _check_op(op, "allreduce", [tensor])

    def fwd(x, nm):
        return _allreduce_raw([x], [nm], op, prescale_factor, postscale_factor, process_set)[0]

    def bwd(dy, x):
        return _allreduce_raw([dy], [_name(None, "AllreduceGrad", dy)], op, prescale_factor, postscale_factor,
                              process_set)[0]
    return _compressed(tensor, compression, name, "Allreduce", fwd, bwd)


def _compressed(tensor, compression, name, kind, forward, backward):
    """Compresses tensor, runs forward(x, name) on it with backward(dy, x) as its gradient, and
    decompresses the result (allreduce and reducescatter)."""
    x, ctx = compression.compress(_tensor(tensor, kind.lower()))
    nm = _name(name, kind, x)
    return compression.decompress(_differentiable([x], lambda t: forward(t, nm), lambda dy: backward(dy, x)), ctx)


def check_sparse_op(op, what):
    """tf.IndexedSlices travel as allgathers of their values and indices: Average and Sum only."""
    if op in (Average, Sum):
        return
    hint = ""
    if op == Adasum:
        hint = ("; for Adasum, pass sparse_as_dense=True to DistributedGradientTape or DistributedOptimizer "
                "(or make the slices dense with tf.convert_to_tensor)")
    raise NotImplementedError("kolo.tensorflow.%s: tf.IndexedSlices travel as an allgather of their values and "
                              "indices, which supports op=Average and Sum only%s" % (what, hint))


def _allreduce_indexed_slices(slices, op, compression, name, process_set):
    check_sparse_op(op, "allreduce")
    values, ctx = compression.compress(slices.values)
    vname = _name(None if name is None else name + ".values", "AllgatherValues", values)
    iname = _name(None if name is None else name + ".indices", "AllgatherIndices", slices.indices)
    values, indices = _allgather_raw([values, slices.indices], [vname, iname], process_set)
    values = compression.decompress(values, ctx)
    if op == Average:
        values = values / _size_as(process_set, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      name=None):
    """Allreduces a list of tensors as one group (one request the engine keeps together); returns a
    list. Differentiable. (name= is kolo's addition.)"""
    op = _op_of(op, average)
    process_set = _pset(process_set)
    tensors = [_tensor(t, "grouped_allreduce") for t in tensors]
    _check_op(op, "grouped_allreduce", tensors)
    if not tensors:
        return []
    compressed = [compression.compress(t) for t in tensors]
    xs = [c[0] for c in compressed]
    gname = _name(name, "GroupedAllreduce", xs[0])

    def fwd(*ts):
        return tuple(_allreduce_raw(list(ts), gname, op, prescale_factor, postscale_factor, process_set,
                                    grouped=True))

    def bwd(*dys):
        dys = [tf.zeros_like(x) if d is None else d for d, x in zip(dys, xs)]
        return tuple(_allreduce_raw(dys, _name(None, "GroupedAllreduceGrad", dys[0]), op, prescale_factor,
                                    postscale_factor, process_set, grouped=True))
    outs = _differentiable(xs, fwd, bwd)
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's tensor along the first dimension (which may differ per rank; the
    others must agree). Differentiable: the gradient is this rank's rows of the averaged gradient."""
    process_set = _pset(process_set)
    tensor = _tensor(tensor, "allgather")
    nm = _name(name, "Allgather", tensor)

    def fwd(x):
        return _allgather_raw([x], [nm], process_set)[0]

    def bwd(dy):
        rows = tf.shape(tensor, out_type=tf.int64)[:1]
        g = _allgather_grad_raw(dy, rows, process_set)
        g.set_shape(tensor.shape)
        return g
    return _differentiable([tensor], fwd, bwd)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors in one batch; returns a list (not differentiable)."""
    process_set = _pset(process_set)
    tensors = [_tensor(t, "grouped_allgather") for t in tensors]
    n = len(tensors)
    names = [None if name is None else "%s_%dof%d" % (name, i + 1, n) for i in range(n)]
    names = [_name(nm, "GroupedAllgather", t) for nm, t in zip(names, tensors)]
    return _allgather_raw(tensors, names, process_set)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns root_rank's tensor on every rank (root_rank is a world rank). Differentiable: the root
    gets the averaged gradient, the other ranks zero."""
    process_set = _pset(process_set)
    tensor = _tensor(tensor, "broadcast")
    nm = _name(name, "Broadcast", tensor)

    def fwd(x):
        return _broadcast_raw([x], [nm], root_rank, process_set)[0]

    def bwd(dy):
        g = _allreduce_raw([dy], [_name(None, "BroadcastGrad", dy)], Average, 1.0, 1.0, process_set)[0]
        return g if rank() == root_rank else g * 0
    return _differentiable([tensor], fwd, bwd)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends splits[r] first-dimension rows to rank r (None: equal parts) and returns the rows
    received, in rank order; with splits given, (output, received_splits). Differentiable: the
    gradient goes back with the received splits."""
    process_set = _pset(process_set)
    tensor = _tensor(tensor, "alltoall")
    nm = _name(name, "Alltoall", tensor)
    sp = None if splits is None else tf.reshape(tf.cast(tf.convert_to_tensor(splits), tf.int32), [-1])

    def fwd(x):
        out, rsplits = _alltoall_raw(x, sp, nm, process_set)

        def bwd(dy, drsplits=None):
            return _alltoall_raw(dy, rsplits, _name(None, "AlltoallGrad", dy), process_set)[0]
        return (out, rsplits), bwd

    if tensor.dtype.is_floating:
        out, rsplits = tf.custom_gradient(fwd)(tensor)
    else:
        out, rsplits = fwd(tensor)[0]
    return out if splits is None else (out, rsplits)


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces every rank's tensor and returns this rank's share of the first dimension (the first
    dim % size ranks get one more row). Differentiable: the gradient is the allgathered gradient
    (divided by the size for Average, times the factors)."""
    process_set = _pset(process_set)
    _check_op(op, "reducescatter")

    def fwd(x, nm):
        return _reducescatter_raw([x], [nm], op, prescale_factor, postscale_factor, process_set)[0]

    def bwd(dy, x):
        g = _allgather_raw([dy], [_name(None, "ReducescatterGrad", dy)], process_set)[0]
        scale = prescale_factor * postscale_factor
        g = g if scale == 1.0 else g * tf.cast(scale, g.dtype)
        g = g / _size_as(process_set, g.dtype) if op == Average else g
        g.set_shape(x.shape)
        return g
    return _compressed(tensor, compression, name, "Reducescatter", fwd, bwd)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average, name=None,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatters a list of tensors in one batch; returns a list (not differentiable)."""
    process_set = _pset(process_set)
    _check_op(op, "grouped_reducescatter")
    tensors = [_tensor(t, "grouped_reducescatter") for t in tensors]
    compressed = [compression.compress(t) for t in tensors]
    n = len(tensors)
    names = [None if name is None else "%s_%dof%d" % (name, i + 1, n) for i in range(n)]
    names = [_name(nm, "GroupedReducescatter", c[0]) for nm, c in zip(names, compressed)]
    outs = _reducescatter_raw([c[0] for c in compressed], names, op, prescale_factor, postscale_factor,
                              process_set)
    return [compression.decompress(o, c[1]) for o, c in zip(outs, compressed)]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assigns root_rank's values to variables (one variable or a list) on every rank; returns them."""
    from kolo.tensorflow.functions import broadcast_variables
    single = not isinstance(variables, (list, tuple))
    broadcast_variables([variables] if single else variables, root_rank, process_set, name=name)
    return variables


def join(process_set=global_process_set):
    """This rank has no more data: until every rank has joined, the others' allreduces go on with
    zeros from this rank. Returns the last rank to join (an int32 tensor)."""
    process_set = _pset(process_set)
    spec = _Spec(0, lambda: [_ops.join_async(process_set)],
                 lambda results: [np.asarray(results[0], dtype=np.int32)])
    return _execute([spec], [], [tf.int32], [[]], "join")[0]


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it (kolo's addition to Horovod's TF API)."""
    process_set = _pset(process_set)
    spec = _Spec(0, lambda: [_ops.barrier_async(process_set)], lambda results: [np.zeros((), np.int32)])
    return _execute([spec], [], [tf.int32], [[]], "barrier")[0]


# ---- the job's shape as tensors, read when the op runs (Horovod's *_op) ----

def _value_op(f, what):
    if tf.executing_eagerly():
        return tf.constant(f(), dtype=tf.int32)
    return tf.numpy_function(lambda: np.asarray(f(), dtype=np.int32), [], tf.int32, name="Kolo" + what)


def size_op(process_set_id=0, name=None):
    from kolo import basics
    if process_set_id == 0:
        return _value_op(basics.size, "Size")
    return _value_op(lambda: _ops._set_size(process_set_id), "Size")


def local_size_op(name=None):
    from kolo import basics
    return _value_op(basics.local_size, "LocalSize")


def rank_op(name=None):
    from kolo import basics
    return _value_op(basics.rank, "Rank")


def local_rank_op(name=None):
    from kolo import basics
    return _value_op(basics.local_rank, "LocalRank")


def process_set_included_op(process_set_id=0, name=None):
    return _value_op(lambda: int(_ops._set_rank(process_set_id) >= 0), "ProcessSetIncluded")
