"""What every framework binding shares: start and stop, the job's shape, reduce ops,
process sets, the timeline and build information (Horovod's horovod.common.basics)."""

import atexit
import ctypes
import json
import threading

from kolo import _lib
from kolo.exceptions import HorovodInternalError, KoloWorkerRemovedError

# Reduce ops, with Horovod's values (horovod.common.basics: AVERAGE=0, SUM=1, ADASUM=2, ...).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_OP_TO_C = {Average: _lib.C_AVERAGE, Sum: _lib.C_SUM, Adasum: _lib.C_ADASUM, Min: _lib.C_MIN, Max: _lib.C_MAX,
            Product: _lib.C_PRODUCT}
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


def c_op(op):
    """kolo_op_t for a Python op. Whether the op suits the dtype and the collective (Adasum:
    floating dtypes, allreduce only) is libkolo's to say: it refuses at submission with
    KOLO_ERR_INVALID_ARG, which surfaces as ValueError."""
    try:
        return _OP_TO_C[op]
    except (KeyError, TypeError):
        raise ValueError("unknown reduce op %r; use one of hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, "
                         "hvd.Max, hvd.Product" % (op,)) from None


def op_name(op):
    return _OP_NAMES.get(op, str(op))


_NOT_INIT = "kolo has not been initialized; use hvd.init()."
_lock = threading.RLock()
_shutdown_hooks = []  # run by shutdown(): the request layer drops its handles


def _require_init():
    if not _lib.kolo_is_initialized():
        raise ValueError(_NOT_INIT)


def init(comm=None, process_sets=None):
    """Joins the job (rank, size and rendezvous from the environment that kolorun, horovodrun,
    torchrun, mpirun or srun set; nothing set: a world of one). Calling it again while
    initialized does nothing; after shutdown() it joins a new job.

    comm: None, or a list of every rank (kolo cannot restrict the world to a subset: use a
    process set). process_sets: ProcessSet objects to register after start (every rank must
    pass the same list), or "dynamic" (accepted; kolo's sets are always dynamic).

    In a worker of an elastic job (kolorun --min-np ...), init() after shutdown() joins the
    job's newest round, with the rank and size kolorun gave this worker there; a worker that
    kolorun removed from the job gets KoloWorkerRemovedError (a ValueError)."""
    if comm is not None:
        if isinstance(comm, (list, tuple)):
            ranks = sorted(comm)
        else:
            raise NotImplementedError("kolo.init(comm=...) with an MPI communicator is not supported; "
                                      "kolo does not use MPI. Start with kolorun/mpirun and use process sets.")
    with _lock:
        was = _lib.kolo_is_initialized()
        st = _lib.kolo_init()
        if st != _lib.OK:
            cls = KoloWorkerRemovedError if st == _lib.ERR_REMOVED else ValueError
            raise cls("kolo initialization failed: %s" % (_lib.last_error() or _lib.strerror(st)))
        if comm is not None and ranks != list(range(size())):
            raise NotImplementedError(
                "kolo.init(comm=%s): kolo cannot restrict the world to a subset of ranks; start only the "
                "workers you need, or create a ProcessSet of those ranks." % (comm,))
        if not was:
            global_process_set._set_id(0)
            global_process_set.ranks = list(range(size()))
        if process_sets is not None and process_sets != "dynamic":
            for ps in process_sets:
                if ps.process_set_id is None:
                    add_process_set(ps)


def shutdown():
    """Leaves the job. Pending requests fail with HorovodInternalError ('shut down')."""
    with _lock:
        _lib.kolo_shutdown()
        for hook in list(_shutdown_hooks):
            hook()
        for ps in list(_registered.values()):
            ps._invalidate()
        _registered.clear()


def is_initialized():
    return bool(_lib.kolo_is_initialized())


def elastic_round():
    """The round of the elastic job this worker joined (1 for the first, one more each time
    kolorun re-formed the job); 0 outside elastic jobs. kolo's addition."""
    return _lib.kolo_elastic_round() if _lib.kolo_elastic_round is not None else 0


def _elastic():
    """True in a worker of an elastic kolorun job (kolo_elastic_enabled): the world's size may
    change between init() and init(), so code that would specialise on size() == 1 does not."""
    return bool(_lib.kolo_elastic_enabled and _lib.kolo_elastic_enabled())


def _query(f):
    v = f()
    if v < 0:
        raise ValueError(_NOT_INIT)
    return v


def size():
    return _query(_lib.kolo_size)


def rank():
    return _query(_lib.kolo_rank)


def local_size():
    return _query(_lib.kolo_local_size)


def local_rank():
    return _query(_lib.kolo_local_rank)


def cross_size():
    return _query(_lib.kolo_cross_size)


def cross_rank():
    return _query(_lib.kolo_cross_rank)


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    _require_init()
    n = size()
    return n % local_size() == 0 and cross_size() * local_size() == n


# ---- build information: kolo brings its own transports and builds none of these ----
def mpi_threads_supported():
    raise ValueError("kolo is not using MPI (mpi_enabled() is False).")


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def sycl_built():
    # Horovod after 0.28 (its current examples call it unless told --no-cuda)
    return False


def cuda_built():
    return False


def rocm_built():
    return False


def build_info():
    """kolo's build line: version, transports, vector units."""
    return (_lib.kolo_build_info() or b"").decode()


def peer_transport(peer):
    """"self", "shm" or "tcp": how this rank reaches world rank `peer` ("shm" only when both its
    connections there, the engine's and the direct collectives', have shared memory)."""
    t = _lib.kolo_peer_transport(int(peer))
    return t.decode() if t else None


# ---- process sets ----
_registered = {}  # id -> ProcessSet (not the global one)


class ProcessSet:
    """A subset of the world's ranks on which collectives run (Horovod's ProcessSet).
    Register it with add_process_set() (or init(process_sets=[...])) on every rank."""

    def __init__(self, ranks_or_comm):
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise ValueError("ProcessSet takes a list of ranks; kolo does not use MPI communicators.")
        self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.process_set_id = None
        self.mpi_comm = None

    def _set_id(self, i):
        self.process_set_id = i

    def _invalidate(self):
        self.process_set_id = None

    def _id(self):
        if self.process_set_id is None:
            raise ValueError("%s has not been registered: call hvd.add_process_set() on every rank first."
                             % self)
        return self.process_set_id

    def size(self):
        if self.process_set_id is None:
            return None
        out = ctypes.c_int()
        _lib.check(_lib.kolo_process_set_size(self.process_set_id, ctypes.byref(out)))
        return out.value

    def rank(self):
        """This process's rank within the set (-1 when it is not a member)."""
        if self.process_set_id is None:
            return None
        out = ctypes.c_int()
        _lib.check(_lib.kolo_process_set_rank(self.process_set_id, ctypes.byref(out)))
        return out.value

    def included(self):
        if self.process_set_id is None:
            return None
        return self.rank() >= 0

    def set_rank_of(self, world_rank):
        """The rank within this set of a world rank (roots of broadcasts are world ranks)."""
        ranks = self.ranks if self.process_set_id != 0 else list(range(size()))
        try:
            return ranks.index(int(world_rank))
        except ValueError:
            raise ValueError("root rank %d is not in %s" % (world_rank, self)) from None

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    def __hash__(self):
        return hash((tuple(self.ranks), self.process_set_id))


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set):
    """Registers a process set on every rank (a collective over the world: every rank calls it
    with the same ranks, in the same order). Returns the ProcessSet, now with its id."""
    _require_init()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError("Attempted to add a duplicate process set: %s" % ps)
    for other in _registered.values():
        if other.ranks == ps.ranks:
            raise ValueError("Attempted to add a duplicate process set: %s (already registered as id %d)"
                             % (ps, other.process_set_id))
    if ps.ranks == list(range(size())):
        raise ValueError("Attempted to add a duplicate process set: %s is the global process set" % ps)
    arr = (ctypes.c_int * max(1, len(ps.ranks)))(*ps.ranks)
    out = ctypes.c_int(-1)
    _lib.check(_lib.kolo_process_set_add(arr, len(ps.ranks), ctypes.byref(out)),
               "add_process_set(%s)" % ps.ranks)
    ps._set_id(out.value)
    _registered[out.value] = ps
    return ps


def remove_process_set(process_set):
    """Removes a registered process set (collective over the world). Returns True if it was
    registered."""
    _require_init()
    if process_set.process_set_id is None:
        return False
    if process_set.process_set_id == 0:
        raise ValueError("the global process set cannot be removed")
    _lib.check(_lib.kolo_process_set_remove(process_set.process_set_id), "remove_process_set")
    _registered.pop(process_set.process_set_id, None)
    process_set._invalidate()
    return True


def _pset_id(process_set):
    if process_set is None:
        return 0
    if isinstance(process_set, int):
        return process_set
    return process_set._id()


# ---- timeline and engine counters ----
def start_timeline(file_path, mark_cycles=False):
    """Starts writing this rank's engine activity as Chrome-trace JSON to file_path
    (open it in chrome://tracing or Perfetto). No environment variable is needed."""
    _require_init()
    if _lib.kolo_timeline_start is None:
        raise NotImplementedError("this libkolo has no engine timeline")
    _lib.check(_lib.kolo_timeline_start(str(file_path).encode(), 1 if mark_cycles else 0), "start_timeline")


def stop_timeline():
    """Stops the timeline and closes its file (valid JSON afterwards)."""
    if _lib.kolo_timeline_stop is None:
        return
    _lib.check(_lib.kolo_timeline_stop(), "stop_timeline")


def engine_stats():
    """The engine's counters as a dict (cycles, requests, cache hits and misses, fused
    collectives, ...). kolo's addition, for tests and tuning."""
    _require_init()
    if _lib.kolo_engine_stats is None:
        return {}
    s = _lib.EngineStats()
    _lib.check(_lib.kolo_engine_stats(ctypes.byref(s)))
    return {name: getattr(s, name) for name, _ in _lib.EngineStats._fields_}


def engine_params():
    """The engine's values in use and the autotuner's progress, as a dict: cycle_time_ms,
    fusion_threshold (bytes; 0: no fusion), autotune ("off", "tuning" or "done": KOLO_AUTOTUNE,
    kolorun --autotune) and samples (configurations scored). While tuning, every rank reports
    rank 0's values, which all ranks apply together. kolo's addition."""
    _require_init()
    if _lib.kolo_engine_params is None:
        return {}
    p = _lib.EngineParams()
    _lib.check(_lib.kolo_engine_params(ctypes.byref(p)))
    return {"cycle_time_ms": p.cycle_time_ms, "fusion_threshold": p.fusion_threshold,
            "autotune": {0: "off", 1: "tuning", 2: "done"}.get(p.autotune, str(p.autotune)), "samples": p.samples}


def status():
    """This rank's status as a dict (kolo_status_json, kolo.h, documents every member): the
    direct collective it is in, the tensors of each process set that some ranks have submitted
    and others not yet (with the missing ranks), what the engine thread does, and the ranks each
    waits for when nothing has moved for a moment. Callable from any thread, also while another
    thread waits in kolo: for health checks, and for finding the rank a stuck job waits on. It
    waits half a second at most. kolo's addition."""
    _require_init()
    if _lib.kolo_status_json is None:
        return {}
    cap = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = _lib.kolo_status_json(buf, cap)
        if n < 0:
            _lib.check(n, "status")
        if n < cap:
            return json.loads(buf.value.decode("utf-8"))
        cap = n + 4096  # it grew between the calls: room for a little more


@atexit.register
def _at_exit():
    # Leave the job cleanly (peers see a goodbye, not a lost connection).
    try:
        if _lib.kolo_is_initialized():
            shutdown()
    except Exception:
        pass


__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "init", "shutdown", "is_initialized",
           "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank", "is_homogeneous",
           "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built",
           "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built", "build_info", "ProcessSet",
           "global_process_set", "add_process_set", "remove_process_set", "start_timeline",
           "stop_timeline", "engine_stats", "engine_params", "status", "HorovodInternalError",
           "peer_transport", "elastic_round"]
