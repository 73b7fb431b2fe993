"""Shared set-up of kolo's Python tests.

Most suites are multi-rank: scripts/test-python.sh starts them with
`kolorun -np N python3 -m pytest python/tests`, so every rank runs the same tests in the same
order and their collectives meet. Such tests need kolorun (KOLO_RANK in the environment) and
are skipped otherwise. test_jobs.py is the opposite: it launches kolorun jobs itself and runs
outside kolorun.

Every test gets a deadline (KOLO_TEST_TIMEOUT seconds, default 90): a test that waits for a
rank that already failed ends with an error instead of hanging the run. Outside kolorun, where a
test starts whole jobs (JVMs, Ray's nodes, TensorFlow in every worker) and `make test` runs it
beside the C suites, the deadline is KOLO_TEST_STANDALONE_TIMEOUT (default 180, at least
KOLO_TEST_TIMEOUT): the Keras estimator's test takes 37 s on an idle 2-core machine, and its
suite 1.35x as long beside them.

Outside kolorun, the JVMs the Spark suites start (local drivers, a standalone cluster's master,
workers and executors, in namespaces too) inherit two settings, unless already set:
SPARK_LOCAL_DIRS, a directory of this run's removed at its end (a JVM killed with its job, as the
standalone cluster is, leaves its "spark-<uuid>" directory behind, in /tmp otherwise), and
SPARK_SUBMIT_OPTS=-XX:TieredStopAtLevel=1 (the drivers compile with C1 only: a suite's short-lived
JVMs then take a fifth less CPU, which the suites share with the C suites in `make test`). Ray's
nodes likewise keep their sessions (logs, sockets) under RAY_TMPDIR, a directory of this run's,
not in /tmp/ray, where they would stay, three sessions a run of the Ray suite.

Under kolorun each rank's pytest keeps its temporary directories under a base of its own (named
by the job and rank, removed at the end): the ranks' pytests would otherwise share
/tmp/pytest-of-<user> and trip over each other's clean-up of old runs (a PytestWarning, an
error under -W error).
"""

import os
import shutil
import signal
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.append(os.path.join(ROOT, "bench", "peers"))  # benchcommon.free_port

UNDER_KOLORUN = "KOLO_RANK" in os.environ and "KOLO_RENDEZVOUS" in os.environ
TIMEOUT = int(os.environ.get("KOLO_TEST_TIMEOUT", "90"))
if not UNDER_KOLORUN:
    TIMEOUT = max(TIMEOUT, int(os.environ.get("KOLO_TEST_STANDALONE_TIMEOUT", "180")))


def pytest_collection_modifyitems(config, items):
    for item in items:
        multi = item.get_closest_marker("standalone") is None
        if multi and not UNDER_KOLORUN:
            item.add_marker(pytest.mark.skip(reason="multi-rank test: run under kolorun (scripts/test-python.sh)"))
        if not multi and UNDER_KOLORUN:
            item.add_marker(pytest.mark.skip(reason="launches its own jobs: run outside kolorun"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "standalone: runs outside kolorun and starts its own jobs")
    if UNDER_KOLORUN and config.option.basetemp is None:
        job = os.environ.get("KOLO_JOB_ID", "job%d" % os.getppid())
        config.option.basetemp = os.path.join(tempfile.gettempdir(), "kolo-pytest-%s-rank%s" % (
            job, os.environ["KOLO_RANK"]))
        config._kolo_basetemp = config.option.basetemp
    if not UNDER_KOLORUN:
        config._kolo_scratch = []
        for var, prefix in (("SPARK_LOCAL_DIRS", "kolo-spark-local-"), ("RAY_TMPDIR", "kolo-ray-")):
            if var not in os.environ:
                os.environ[var] = tempfile.mkdtemp(prefix=prefix)
                config._kolo_scratch.append(os.environ[var])
        os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


def pytest_unconfigure(config):
    for base in [getattr(config, "_kolo_basetemp", None)] + getattr(config, "_kolo_scratch", []):
        if base:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def kolo_job():
    if not UNDER_KOLORUN:
        yield
        return
    import kolo
    kolo.init()
    yield
    kolo.shutdown()


class _Deadline(Exception):
    pass


@pytest.fixture(autouse=True)
def deadline():
    def on_alarm(signum, frame):
        raise _Deadline("test exceeded %d s (%s)" % (TIMEOUT, "a rank waiting for another that failed?" if UNDER_KOLORUN
                                                    else "a job that hangs? KOLO_TEST_STANDALONE_TIMEOUT"))
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIMEOUT)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def kolo_alive():
    """A test that shut kolo down (re-init tests) leaves it initialized for the next."""
    yield
    if UNDER_KOLORUN:
        import kolo
        if not kolo.is_initialized():
            kolo.init()
