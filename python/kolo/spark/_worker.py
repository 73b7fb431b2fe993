"""One rank of a kolo.spark.run job: `python -m kolo.spark._worker DIR`, started by its Spark task.

Reads (fn, args, kwargs) from DIR/payload, runs fn with kolo's variables already in the
environment, and writes its pickled return value to DIR/result (exit 0), or the exception's
last line to DIR/error and the traceback to stderr (exit 1). Dies with its task: the parent-death
signal is set first, then the parent checked (it may have gone before the signal was set).
"""

import ctypes
import os
import signal
import sys
import traceback

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    parent = int(os.environ.get("KOLO_SPARK_PARENT", "0") or 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the check below still catches a parent gone at start
        pass
    if parent and os.getppid() != parent:
        sys.exit(1)


def main(argv):
    if len(argv) != 1:
        print("usage: python -m kolo.spark._worker DIR (started by kolo.spark.run)", file=sys.stderr)
        return 2
    _die_with_parent()
    d = argv[0]
    try:
        from pyspark import cloudpickle
    except ImportError:
        import pickle as cloudpickle  # the payload needs cloudpickle only for functions defined in __main__
    try:
        with open(os.path.join(d, "payload"), "rb") as f:
            fn, args, kwargs = cloudpickle.loads(f.read())
        try:
            result = fn(*args, **kwargs)
        except SystemExit as e:  # sys.exit(): its code is the rank's, as for a script
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if code == 0:
                result = None
            else:
                if not isinstance(e.code, int):
                    print(e.code, file=sys.stderr, flush=True)
                with open(os.path.join(d, "error"), "w", encoding="utf-8") as f:
                    f.write("the function called sys.exit(%r)" % (e.code,))
                return code
        data = cloudpickle.dumps(result)
    except BaseException as e:  # noqa: B902 - the rank's failure, whatever it is, goes to the driver
        traceback.print_exc()
        sys.stderr.flush()
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        with open(os.path.join(d, "error"), "w", encoding="utf-8") as f:
            f.write(last)
        return 1  # without kolo.shutdown: the other ranks learn that this one was lost, not that it left
    kolo = sys.modules.get("kolo")
    if kolo is not None and kolo.is_initialized():
        kolo.shutdown()
    with open(os.path.join(d, "result"), "wb") as f:
        f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
