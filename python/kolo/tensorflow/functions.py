"""Helpers that keep every rank's state identical (horovod/tensorflow/functions.py): broadcast_variables,
broadcast_global_variables, broadcast_object, broadcast_object_fn, allgather_object."""

import pickle

import numpy as np
import tensorflow as tf

import kolo
from kolo.basics import global_process_set, rank
from kolo.tensorflow.mpi_ops import _broadcast_raw, _pset, _tensor

try:  # cloudpickle pickles lambdas and local classes as Horovod does; plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the machine
    _pickler = pickle


def variable_name(v, i):
    """A variable's name for kolo's requests: Keras 3's path, else TensorFlow's name without ':0',
    else its position."""
    n = getattr(v, "path", None) or getattr(v, "name", None)
    if not n:
        return str(i)
    return n[:-2] if n.endswith(":0") else n


def unique_names(prefix, variables):
    """'<prefix>.<variable name>' for each variable, made unique in the list by a '.<k>' suffix on
    repeats (the list is in the same order on every rank, so the names agree)."""
    seen, out = {}, []
    for i, v in enumerate(variables):
        n = "%s.%s" % (prefix, variable_name(v, i))
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else "%s.%d" % (n, k))
    return out


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False, name=None):
    """Assigns root_rank's values to every variable of the list, on every rank, in one batch (the
    engine negotiates and fuses them together). Eagerly it returns None once done; inside tf.function
    it returns the op that assigns them. inplace is accepted for Horovod's signature."""
    process_set = _pset(process_set)
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = [_tensor(v, "broadcast_variables") for v in variables]
    names = unique_names("broadcast_variables" if name is None else name, variables)
    outs = _broadcast_raw(values, names, root_rank, process_set)
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    if tf.executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_global_variables(root_rank):
    """Horovod's TensorFlow 1 helper: broadcasts tf.compat.v1.global_variables() from root_rank. Eagerly
    it raises RuntimeError, as Horovod's does (TensorFlow 2 keeps no global collection of variables: name
    them with broadcast_variables); inside tf.function it broadcasts that collection (usually empty)."""
    if tf.executing_eagerly():
        raise RuntimeError("kolo.tensorflow.broadcast_global_variables() does not run eagerly: TensorFlow 2 keeps "
                           "no collection of global variables. Use kolo.tensorflow.broadcast_variables("
                           "model.variables, root_rank) (and the optimizer's variables) instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook:
    """Horovod's TensorFlow 1 SessionRunHook (for tf.estimator and MonitoredTrainingSession), refused
    with the reason when it is made: kolo's collectives do not run in TensorFlow 1 sessions (a session
    runs independent collectives in any order; docs/tensorflow.md), and TensorFlow 2 removed
    tf.estimator."""

    def __init__(self, root_rank, device=""):
        raise NotImplementedError(
            "kolo.tensorflow.BroadcastGlobalVariablesHook is a TensorFlow 1 SessionRunHook, and kolo's "
            "collectives do not run in TensorFlow 1 sessions. Broadcast the variables once they exist: "
            "kolo.tensorflow.broadcast_variables(model.variables, root_rank=%r) after the first step (and the "
            "optimizer's variables), or in Keras the callback "
            "kolo.keras.callbacks.BroadcastGlobalVariablesCallback(%r)." % (root_rank, root_rank))


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Pickles obj on root_rank and returns a copy of it on every rank (eagerly; session is
    accepted for Horovod's signature)."""
    process_set = _pset(process_set)
    name = name or type(obj).__name__
    root = rank() == root_rank
    payload = np.frombuffer(_pickler.dumps(obj), dtype=np.uint8) if root else np.zeros(0, np.uint8)
    n = kolo.broadcast(np.array([payload.size], np.int64), root_rank, name + ".sz", process_set)
    if not root:
        payload = np.zeros(int(n[0]), np.uint8)
    data = kolo.broadcast(payload, root_rank, name + ".t", process_set)
    return obj if root else _pickler.loads(data.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> root_rank's obj, for Horovod scripts that build the broadcast once and call it
    later (session is accepted for Horovod's signature; kolo's broadcast runs eagerly)."""
    name = name or "broadcast_object_fn"

    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    return broadcast_fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Pickles obj on every rank; returns the list of every rank's object, in rank order."""
    process_set = _pset(process_set)
    name = name or type(obj).__name__
    payload = np.frombuffer(_pickler.dumps(obj), dtype=np.uint8)
    sizes = kolo.allgather(np.array([payload.size], np.int64), name + ".sz", process_set)
    data = kolo.allgather(payload, name + ".t", process_set).tobytes()
    ends = np.cumsum(sizes)
    return [_pickler.loads(data[e - s:e]) for s, e in zip(sizes.tolist(), ends.tolist())]
