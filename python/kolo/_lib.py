"""Loads libkolo through ctypes, declares the C prototypes of include/kolo.h, and turns
kolo's status codes into Python exceptions.

Where the library comes from, in order:
  1. the file named by the KOLO_LIBRARY environment variable;
  2. the source tree's build: <repo>/build/lib/libkolo.so, found relative to this package
     (python/kolo/ -> ../../build/lib), so `PYTHONPATH=python` works after `make`;
  3. the installed library: libkolo.so.0 / libkolo.so through the dynamic loader
     (`make install` puts it in $PREFIX/lib), then <sys.prefix>/lib.
The library's kolo_version() must equal this package's version; anything else is refused
with an ImportError that says which file was loaded and how to fix it.

ctypes releases the GIL around every foreign call, so a blocking wait in C never stops
other Python threads.
"""

import ctypes
import ctypes.util
import os
import sys

from kolo.exceptions import HorovodInternalError, KoloVersionMismatchError

__version__ = "0.1.0"
EXPECTED_VERSION_NUMBER = 100  # major * 10000 + minor * 100 + patch, as KOLO_VERSION_NUMBER

# ---- status codes (kolo_status_t) ----
OK = 0
ERR_INVALID_ARG = -1
ERR_NO_MEMORY = -2
ERR_NOT_INITIALIZED = -3
ERR_NOT_MEMBER = -4
ERR_PEER_LOST = -10
ERR_TIMEOUT = -11
ERR_MISMATCH = -12
ERR_SHUT_DOWN = -13
ERR_PROTOCOL = -14
ERR_AUTH = -15
ERR_STARTUP = -16
ERR_REMOVED = -17
ERR_SYSTEM = -20
ERR_INTERNAL = -21

# ---- dtypes (kolo_dtype_t) and ops (kolo_op_t) ----
UINT8, INT8, UINT16, INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL = range(11)
DTYPE_SIZES = {UINT8: 1, INT8: 1, UINT16: 2, INT16: 2, INT32: 4, INT64: 8, FLOAT16: 2,
               BFLOAT16: 2, FLOAT32: 4, FLOAT64: 8, BOOL: 1}
C_SUM, C_AVERAGE, C_MIN, C_MAX, C_PRODUCT, C_ADASUM = range(6)

MAX_DIMS = 8


class Shape(ctypes.Structure):
    _fields_ = [("ndim", ctypes.c_int), ("dims", ctypes.c_int64 * MAX_DIMS)]


class SubmitOpts(ctypes.Structure):
    _fields_ = [("process_set", ctypes.c_int), ("callback", ctypes.c_void_p),
                ("user", ctypes.c_void_p), ("device", ctypes.c_char_p)]


class EngineStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "cycles", "requests", "cache_hits", "cache_misses", "cache_evictions",
        "fused_collectives", "collectives", "stall_warnings")]


class EngineParams(ctypes.Structure):
    _fields_ = [("cycle_time_ms", ctypes.c_double), ("fusion_threshold", ctypes.c_size_t),
                ("autotune", ctypes.c_int), ("samples", ctypes.c_int)]


def _candidates():
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        # An explicit choice is the only candidate: silently loading another file would hide
        # the mistake the user is trying to fix.
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.normpath(os.path.join(here, "..", "..", "build", "lib", "libkolo.so"))]
    out += ["libkolo.so.0", "libkolo.so"]
    found = ctypes.util.find_library("kolo")
    if found:
        out.append(found)
    for prefix in (sys.prefix, "/usr/local", "/usr"):
        out.append(os.path.join(prefix, "lib", "libkolo.so.0"))
    return out, False


def _load():
    cands, explicit = _candidates()
    errors = []
    for c in cands:
        if os.path.sep in c and not os.path.exists(c):
            errors.append("%s: no such file" % c)
            continue
        try:
            return ctypes.CDLL(c), c
        except OSError as e:
            errors.append("%s: %s" % (c, e))
    broken = [e for c, e in zip(cands, errors) if not e.endswith("no such file") and
              "cannot open shared object file" not in e]
    if explicit:
        hint = "KOLO_LIBRARY=%s cannot be loaded; point it at libkolo.so (built by `make` under build/lib/)." % cands[0]
    elif broken:
        hint = ("libkolo.so was found but cannot be loaded (an incomplete or mismatched build?). Rebuild it "
                "with `make` in the kolo source tree, or set KOLO_LIBRARY to a working libkolo.so.")
    else:
        hint = ("libkolo.so was not found. Build it with `make` in the kolo source tree (it lands in build/lib/), "
                "install it with `make install`, or set KOLO_LIBRARY to its path.")
    raise ImportError(hint + "\nTried:\n  " + "\n  ".join(errors))


lib, path = _load()


def _stack_traces_on_signal():
    """kolorun --get-stack-traces exports KOLO_STACK_TRACES=1: then every thread's Python stack
    is printed to stderr on SIGUSR2 (faulthandler, in C, so it works while threads are blocked
    in kolo), which kolorun sends at --timeout to the workers that catch it. A handler the
    program installed itself is left alone."""
    if os.environ.get("KOLO_STACK_TRACES") != "1":
        return
    import faulthandler
    import signal
    try:
        if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
            faulthandler.register(signal.SIGUSR2, all_threads=True)
    except (AttributeError, ValueError, RuntimeError, OSError):
        pass  # no SIGUSR2 here, or a stderr faulthandler cannot use: no stacks, nothing else lost


_stack_traces_on_signal()


def _proto(name, restype, *argtypes, optional=False):
    try:
        f = getattr(lib, name)
    except AttributeError:
        if optional:
            return None
        raise ImportError("%s (loaded from %s) lacks %s(); it is older than this kolo package. "
                          "Rebuild it with `make`, or set KOLO_LIBRARY to a matching build." % (
                              os.path.basename(path), path, name))
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


c_int, c_double, c_size_t, c_char_p, c_void_p = (ctypes.c_int, ctypes.c_double, ctypes.c_size_t,
                                                   ctypes.c_char_p, ctypes.c_void_p)
P = ctypes.POINTER

kolo_version = _proto("kolo_version", c_int)
_found_version = kolo_version()
if _found_version != EXPECTED_VERSION_NUMBER:
    def _fmt(v):
        return "%d.%d.%d" % (v // 10000, (v // 100) % 100, v % 100)
    raise KoloVersionMismatchError(
        "the kolo Python package %s needs libkolo %s, but %s is libkolo %s. Rebuild the library "
        "from the same source tree (`make`), or set KOLO_LIBRARY to the libkolo.so that matches "
        "this package (or reinstall the package from that tree: `pip install ./python`)." % (
            __version__, _fmt(EXPECTED_VERSION_NUMBER), path, _fmt(_found_version)))

kolo_strerror = _proto("kolo_strerror", c_char_p, c_int)
kolo_last_error = _proto("kolo_last_error", c_char_p)
kolo_build_info = _proto("kolo_build_info", c_char_p)
kolo_dtype_name = _proto("kolo_dtype_name", c_char_p, c_int)
kolo_init = _proto("kolo_init", c_int)
kolo_shutdown = _proto("kolo_shutdown", c_int)
kolo_is_initialized = _proto("kolo_is_initialized", c_int)
kolo_rank = _proto("kolo_rank", c_int)
kolo_size = _proto("kolo_size", c_int)
kolo_local_rank = _proto("kolo_local_rank", c_int)
kolo_local_size = _proto("kolo_local_size", c_int)
kolo_cross_rank = _proto("kolo_cross_rank", c_int)
kolo_cross_size = _proto("kolo_cross_size", c_int)
kolo_peer_transport = _proto("kolo_peer_transport", c_char_p, c_int)

kolo_process_set_add = _proto("kolo_process_set_add", c_int, P(c_int), c_int, P(c_int))
kolo_process_set_remove = _proto("kolo_process_set_remove", c_int, c_int)
kolo_process_set_rank = _proto("kolo_process_set_rank", c_int, c_int, P(c_int))
kolo_process_set_size = _proto("kolo_process_set_size", c_int, c_int, P(c_int))
kolo_process_set_ranks = _proto("kolo_process_set_ranks", c_int, c_int, P(c_int), c_int)

kolo_allreduce = _proto("kolo_allreduce", c_int, c_void_p, c_void_p, c_size_t, c_int, c_int,
                        c_double, c_double, c_int)
kolo_allgather = _proto("kolo_allgather", c_int, c_void_p, c_size_t, c_void_p, P(c_size_t), c_int, c_int)
kolo_broadcast = _proto("kolo_broadcast", c_int, c_void_p, c_size_t, c_int, c_int, c_int)
kolo_alltoall = _proto("kolo_alltoall", c_int, c_void_p, P(c_size_t), c_void_p, P(c_size_t), c_int, c_int)
kolo_reducescatter = _proto("kolo_reducescatter", c_int, c_void_p, c_void_p, c_size_t, c_size_t, c_int,
                            c_int, c_double, c_double, c_int)
kolo_reducescatter_rows = _proto("kolo_reducescatter_rows", c_size_t, c_size_t, c_int, c_int)
kolo_barrier = _proto("kolo_barrier", c_int, c_int)
kolo_mem_alloc = _proto("kolo_mem_alloc", c_void_p, c_size_t)
kolo_mem_free = _proto("kolo_mem_free", c_int, c_void_p)

# ---- the engine (optional until every build has it) ----
_req = c_void_p
kolo_iallreduce = _proto("kolo_iallreduce", c_int, c_char_p, c_void_p, c_void_p, c_int, P(Shape), c_int,
                         c_double, c_double, P(SubmitOpts), P(_req), optional=True)
kolo_igrouped_allreduce = _proto("kolo_igrouped_allreduce", c_int, c_int, P(c_char_p), P(c_void_p),
                                 P(c_void_p), c_int, P(Shape), c_int, c_double, c_double, P(SubmitOpts),
                                 P(_req), optional=True)
kolo_iallgather = _proto("kolo_iallgather", c_int, c_char_p, c_void_p, c_int, P(Shape), P(SubmitOpts),
                         P(_req), optional=True)
kolo_ibroadcast = _proto("kolo_ibroadcast", c_int, c_char_p, c_void_p, c_int, P(Shape), c_int,
                         P(SubmitOpts), P(_req), optional=True)
kolo_ialltoall = _proto("kolo_ialltoall", c_int, c_char_p, c_void_p, c_int, P(Shape), P(ctypes.c_int64),
                        P(SubmitOpts), P(_req), optional=True)
kolo_ireducescatter = _proto("kolo_ireducescatter", c_int, c_char_p, c_void_p, c_int, P(Shape), c_int,
                             c_double, c_double, P(SubmitOpts), P(_req), optional=True)
kolo_ijoin = _proto("kolo_ijoin", c_int, P(SubmitOpts), P(_req), optional=True)
kolo_ibarrier = _proto("kolo_ibarrier", c_int, P(SubmitOpts), P(_req), optional=True)
kolo_request_test = _proto("kolo_request_test", c_int, _req, P(c_int), optional=True)
kolo_request_wait = _proto("kolo_request_wait", c_int, _req, c_double, optional=True)
kolo_request_status = _proto("kolo_request_status", c_int, _req, optional=True)
kolo_request_error = _proto("kolo_request_error", c_char_p, _req, optional=True)
kolo_request_name = _proto("kolo_request_name", c_char_p, _req, optional=True)
kolo_request_output = _proto("kolo_request_output", c_int, _req, P(c_void_p), P(Shape), optional=True)
kolo_request_splits = _proto("kolo_request_splits", c_int, _req, P(ctypes.c_int64), c_int, optional=True)
kolo_request_join_last_rank = _proto("kolo_request_join_last_rank", c_int, _req, optional=True)
kolo_request_release = _proto("kolo_request_release", None, _req, optional=True)
kolo_timeline_start = _proto("kolo_timeline_start", c_int, c_char_p, c_int, optional=True)
kolo_timeline_stop = _proto("kolo_timeline_stop", c_int, optional=True)
kolo_engine_stats = _proto("kolo_engine_stats", c_int, P(EngineStats), optional=True)
kolo_engine_params = _proto("kolo_engine_params", c_int, P(EngineParams), optional=True)
kolo_status_json = _proto("kolo_status_json", c_int, c_char_p, ctypes.c_size_t, optional=True)

# ---- elastic jobs (optional: a library without them runs every job as a fixed one) ----
ELASTIC_NONE, ELASTIC_ADDED, ELASTIC_REMOVED = 0, 1, 2
kolo_elastic_enabled = _proto("kolo_elastic_enabled", c_int, optional=True)
kolo_elastic_round = _proto("kolo_elastic_round", c_int, optional=True)
kolo_elastic_check = _proto("kolo_elastic_check", c_int, P(c_int), optional=True)

# The engine is used when the library has it; KOLO_PYTHON_DIRECT=1 forces the blocking
# direct collectives instead (a debugging aid: no overlap, no join).
HAVE_ENGINE = (kolo_iallreduce is not None and kolo_request_wait is not None
               and os.environ.get("KOLO_PYTHON_DIRECT", "0") in ("", "0"))


def last_error():
    return (kolo_last_error() or b"").decode("utf-8", "replace")


def strerror(status):
    return (kolo_strerror(status) or b"").decode("utf-8", "replace")


_JOB_ERRORS = (ERR_PEER_LOST, ERR_TIMEOUT, ERR_MISMATCH, ERR_SHUT_DOWN, ERR_PROTOCOL, ERR_AUTH,
               ERR_STARTUP, ERR_REMOVED, ERR_SYSTEM, ERR_INTERNAL)


def error_for(status, message, what=None):
    """The exception for a kolo status: ValueError for a bad call, MemoryError, or
    HorovodInternalError (a RuntimeError) for everything that damages the job."""
    text = message or strerror(status)
    if what and what not in text:
        text = "%s: %s" % (what, text)
    if status in (ERR_INVALID_ARG, ERR_NOT_INITIALIZED, ERR_NOT_MEMBER):
        e = ValueError(text)
    elif status == ERR_NO_MEMORY:
        e = MemoryError(text)
    else:
        e = HorovodInternalError(text)
    e.status = status  # the ERR_* code, for the frameworks' own error classes (kolo.tensorflow)
    return e


def check(status, what=None):
    """Raises the exception for a failed call (reading the thread's last error now)."""
    if status != OK:
        raise error_for(status, last_error(), what)
    return status
