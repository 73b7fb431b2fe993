"""Elastic training (Horovod's horovod.common.elastic): the state a training function keeps
across changes of the job's workers, and run(), which re-forms the job around that function.

Under `kolorun --min-np N ...` (docs/kolorun.md, "Elastic jobs") kolorun re-forms the job in
rounds when workers fail or hosts come and go. A worker learns of a new round in one of two ways:

  * a collective fails (a peer lost, a timeout): HorovodInternalError. The state may be half
    updated since the last commit(), so run() rolls it back (restore());
  * commit() or check_host_updates() asks kolorun whether a newer round exists
    (kolo_elastic_check, a collective: every rank gets the same answer) and raises
    HostsUpdatedInterrupt. The state is the one just committed, the same on every rank.

Either way run() leaves the job (shutdown()), joins the newest round (init(): a new rank and
size; rank 0 is the oldest surviving worker, which holds the state), calls the state's reset
callbacks, has every rank take rank 0's state (sync(); skipped when workers were only removed,
since every survivor holds the same committed state then) and calls the training function
again. A worker that kolorun removed from the job exits with status 0 and a line on stderr.

The framework modules (kolo.torch.elastic, kolo.tensorflow.elastic, kolo.keras.elastic) add
states for their models and optimizers; ObjectState here keeps any picklable attributes.
"""

import copy
import ctypes
import functools
import pickle
import socket
import sys

import numpy as np

from kolo import _lib, basics
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt, KoloWorkerRemovedError

try:  # cloudpickle pickles lambdas and local classes as Horovod does; plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the machine
    _pickler = pickle

# What a check finds, as the flags of Horovod's HostUpdateResult (on_hosts_updated takes these).
NO_UPDATE, REMOVED, ADDED, MIXED = 0, 1, 2, 3
_FROM_C = {_lib.ELASTIC_NONE: NO_UPDATE, _lib.ELASTIC_ADDED: ADDED, _lib.ELASTIC_REMOVED: REMOVED}


def _check_hosts():
    """kolo_elastic_check as HostUpdateResult flags. In an elastic job a collective over the world
    (rank 0 asks kolorun); otherwise NO_UPDATE at once, without communicating."""
    if _lib.kolo_elastic_check is None:  # a libkolo without elastic jobs
        return NO_UPDATE
    out = ctypes.c_int(0)
    _lib.check(_lib.kolo_elastic_check(ctypes.byref(out)), "check_host_updates")
    return _FROM_C.get(out.value, MIXED)


def _broadcast_object(obj, root_rank=0, name=None):
    """root_rank's obj on every rank: pickled, its length and bytes broadcast as NumPy arrays."""
    import kolo
    name = name or "elastic." + type(obj).__name__
    root = basics.rank() == root_rank
    payload = np.frombuffer(_pickler.dumps(obj), dtype=np.uint8) if root else np.zeros(0, np.uint8)
    n = kolo.broadcast(np.array([payload.size], np.int64), root_rank, name + ".sz")
    if not root:
        payload = np.zeros(int(n[0]), np.uint8)
    data = kolo.broadcast(payload, root_rank, name + ".t")
    return obj if root else _pickler.loads(data.tobytes())


class State:
    """What a training function keeps across resets of an elastic job (Horovod's State).

    save() takes a copy of the state (commit() calls it), restore() goes back to that copy (after a
    failed collective), sync() gives every rank rank 0's state (after joining a round), reset()
    adapts to the new round (after joining it, before sync). Subclasses define the first three.
    bcast_object(obj) returns rank 0's obj on every rank; get_rank() returns this rank. None for
    either: kolo's own (NumPy broadcasts, kolo.rank)."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or _broadcast_object
        self._rank = get_rank or basics.rank
        self._reset_callbacks = []
        self._reported = NO_UPDATE
        self._last_timestamp = 0

    def register_reset_callbacks(self, callbacks):
        """Functions called without arguments after every reset, once the new round is joined and
        before sync(): e.g. to scale the learning rate to the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._reported = NO_UPDATE
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Horovod's driver reports host changes here. kolo's workers ask kolorun instead
        (check_host_updates), so nothing in kolo calls it; a call made on every rank alike makes
        the next check raise for that update too. update_res: HostUpdateResult flags (REMOVED 1,
        ADDED 2); updates not newer than the last one reported are ignored."""
        if timestamp > self._last_timestamp:
            self._last_timestamp = timestamp
            self._reported |= int(update_res)

    def commit(self):
        """Saves the state, then checks for a newer round (check_host_updates). Commit as often as
        losing the work since the last commit is worse than the copy and the check cost."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when kolorun has formed a newer round of the job, on every
        rank alike (a collective in an elastic job). skip_sync is True when the newer rounds only
        lost workers: every survivor holds the committed state already."""
        update = _check_hosts() | self._reported
        self._reported = NO_UPDATE
        if update != NO_UPDATE:
            raise HostsUpdatedInterrupt(skip_sync=update == REMOVED)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """Picklable attributes given as keyword arguments (epoch=0, batch=0, ...): state.epoch reads
    and sets them. save() keeps deep copies, restore() sets copies of those back, sync() gives
    every rank rank 0's current values (and saves them)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            synced = self._bcast_object({k: getattr(self, k) for k in self._saved_state})
            self._saved_state = {k: copy.deepcopy(v) for k, v in synced.items()}
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


def _reset():
    basics.shutdown()
    basics.init()


def run_fn(func, reset):
    """func(state, *args, **kwargs) in Horovod's elastic loop; reset() leaves the job and joins
    its newest round."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                # Leave the failed round first: after shutdown() none of its requests is pending,
                # so nothing writes into the tensors that restore() rolls back.
                basics.shutdown()
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            try:
                reset()
            except KoloWorkerRemovedError as e:
                sys.stderr.write("kolo: this worker (%s) was removed from the elastic job; it exits (%s)\n"
                                 % (socket.gethostname(), e))
                sys.stderr.flush()
                raise SystemExit(0)
            state.on_reset()
    return wrapper


def run(func):
    """Decorator of a training function func(state, ...) (Horovod's hvd.elastic.run): calls it
    after state.sync(); when a collective fails (HorovodInternalError) or kolorun forms a newer
    round (HostsUpdatedInterrupt from state.commit()), joins the newest round and calls it again
    (the module's docstring has the steps). Returns what func returns."""
    return run_fn(func, lambda: _reset())


__all__ = ["State", "ObjectState", "run", "run_fn", "HostsUpdatedInterrupt", "HorovodInternalError"]
