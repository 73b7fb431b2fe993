"""kolo.spark: run a function as a kolo job on Spark's executors, with horovod.spark.run's API.

    import kolo.spark

    def train(lr):
        import kolo.torch as hvd
        hvd.init()
        ...                                   # the same code as under kolorun
        return model.state_dict() if hvd.rank() == 0 else None

    results = kolo.spark.run(train, args=(0.1,), num_proc=4)   # one result per rank, by rank

How. One Spark barrier stage of num_proc tasks (all start together or none does; Spark's
BarrierTaskContext). Each task learns every task's host from the context, orders the tasks by
host so that ranks of a host are consecutive (rank 0 is partition 0), and starts the function
in a child process of its own with kolo's variables: KOLO_RANK, KOLO_SIZE, the local and cross
ranks, KOLO_RENDEZVOUS at rank 0's host and a port rank 0's task found free (shared with
allGather), KOLO_RENDEZVOUS_SERVER=rank0, and a secret and job id made for this run. A child
process, not the Python worker itself: kolo's threads, shared memory and signal handling stay out
of the worker Spark reuses, and a rank that crashes takes only its child down.

The children's output reaches the driver, line by line, tagged like kolorun's
("[1]<stdout>:..."), through a socket the driver opens for this run (each task proves the run's
secret first); a line holding a carriage return (a progress bar, which rewrites itself and ends
its line only when done) goes out as it comes, each carriage return followed by the tag again, so
the bar moves on the driver as on a terminal. A rank that fails tells the driver at once: the
driver cancels the stage, so Spark neither waits for the other ranks nor retries a failing
function, and raises KoloSparkError naming the rank, its host, its exit code and the last lines
it wrote. A child whose task goes away (the stage cancelled, the executor lost) is killed with
it (parent-death signal, and a check of its parent).

Needs Spark 3.0 or later (barrier stages with allGather), kolo importable on the executors (the
same package; libkolo.so found there as on the driver), and as many free task slots as ranks.
"""

import base64
import codecs
import collections
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid

from kolo import _relay
from kolo._tasks import Server, check_call, free_port, placement, reports_another_rank

__all__ = ["run", "run_elastic", "KoloSparkError"]

_TAIL_LINES = 20


class KoloSparkError(RuntimeError):
    """A rank of a kolo.spark.run job failed. rank, host, exit_code and tail (its last lines of
    output) say which and how."""

    def __init__(self, msg, rank=None, host=None, exit_code=None, tail=()):
        super().__init__(msg)
        self.rank, self.host, self.exit_code, self.tail = rank, host, exit_code, list(tail)


# ---- the driver ----

class _Collector(Server):
    """The driver's end of the output channel: a listening socket, a thread per task."""

    def __init__(self, secret, out, err, timestamps, on_failure):
        self.secret = secret
        self.out, self.err, self.timestamps = out, err, timestamps
        self.on_failure = on_failure
        self.failures = []  # (time received, rank, host, exit code, summary, tail)
        self.lock = threading.Lock()
        self._open = {}  # destination -> (rank, stream) whose line is open there (a bar being drawn)
        self._listen(_relay.listen(128), "kolo.spark output")

    def _serve(self, conn):
        with conn:
            try:
                # a stranger's line was read whole, however long, before it was compared
                hello = self.handshakes.read(conn, _relay.recv_line, 16 + len(self.secret))
                if not secrets.compare_digest(hello, ("kolo.spark " + self.secret).encode()):
                    return  # a stranger on the port: nothing it sends is shown
                conn.settimeout(None)
                f = conn.makefile("r", encoding="utf-8", errors="replace", newline="\n")
                for line in f:
                    try:
                        self._handle(line.rstrip("\n"))
                    except ValueError:  # a garbled line (bad number or base64): the next ones still count
                        pass
            except (OSError, _relay.WireError):  # silent past the hello's deadline, a stranger, or a task's broken link
                pass

    @staticmethod
    def _destination(stream):
        """Where a stream's text lands: stdout and stderr on one terminal are one place."""
        try:
            st = os.fstat(stream.fileno())
            return (st.st_dev, st.st_ino)
        except (AttributeError, OSError, ValueError):  # io.StringIO, a closed or detached stream
            return id(stream)

    def _handle(self, line):
        kind, _, rest = line.partition(" ")
        if kind in ("O", "E", "o", "e"):
            # O / E: (the rest of) a line; o / e: part of a line that holds a carriage return
            rank, _, text = rest.partition(" ")
            err = kind in "Ee"
            stream = self.err if err else self.out
            prefix = time.strftime("%a %b %d %H:%M:%S %Y") + " " if self.timestamps else ""
            tag = "%s[%s]<%s>:" % (prefix, rank, "stderr" if err else "stdout")
            src, ends = (rank, err), kind in "OE"
            with self.lock:
                dest = self._destination(stream)
                opened = self._open.get(dest)
                body = ""
                if opened is not None and opened != src:
                    body = "\n"  # a bar is open there: this output starts below it, not over it
                if opened != src:
                    body += tag
                # after a carriage return the bar redraws from the line's start: the tag with it
                # (not after one that ends the line, CRLF's)
                last = text[:-1] if ends and text.endswith("\r") else text
                body += last.replace("\r", "\r" + tag) + text[len(last):]
                if ends:
                    body += "\n"
                    self._open.pop(dest, None)
                else:
                    self._open[dest] = src
                stream.write(body)
                stream.flush()
        elif kind == "X":
            # X rank host exit_code base64(summary) base64(tail, lines joined by newlines)
            parts = rest.split(" ")
            if len(parts) != 5:
                return
            rank, host, code = int(parts[0]), parts[1], int(parts[2])
            summary = base64.b64decode(parts[3], validate=True).decode("utf-8", "replace")
            tail = base64.b64decode(parts[4], validate=True).decode("utf-8", "replace").split("\n")
            tail = tail if parts[4] else []
            with self.lock:
                self.failures.append((time.monotonic(), rank, host, code, summary, tail))
            self.on_failure()

    def close(self, drain_s=10.0):
        """Stops accepting, then lets the connections still open deliver their last lines (a
        task closes its connection before it returns, so by now each is at or near its end)."""
        self._stop(drain_s)


def _spark_reason(e):
    """The message of the Java exception behind a Py4JJavaError, else the exception's first line."""
    j = getattr(e, "java_exception", None)
    if j is not None:
        try:
            return str(j.getMessage())[:2000]
        except Exception:  # noqa: BLE001 - the gateway may be gone
            pass
    return (str(e).strip().split("\n") or [""])[0][:2000]


def _spark():
    """The active SparkContext (made from the builder's defaults when there is none) and
    PySpark's cloudpickle."""
    try:
        from pyspark import SparkContext
        from pyspark import cloudpickle
    except ImportError as e:
        raise ImportError("kolo.spark needs pyspark (pip install pyspark, Spark 3.0 or later): %s" % e) from None
    sc = SparkContext._active_spark_context
    if sc is None:
        from pyspark.sql import SparkSession
        sc = SparkSession.builder.getOrCreate().sparkContext
    return sc, cloudpickle


def _driver_host(sc):
    host = sc.getConf().get("spark.driver.host", None)
    return host or socket.gethostname()


def _check_args(fn, args, kwargs, num_proc, use_mpi, extra_mpi_args, env):
    check_call("kolo.spark.run", fn, args, kwargs, num_proc)
    if use_mpi:
        raise ValueError("kolo.spark.run: use_mpi=True: kolo does not run over MPI; its own transports "
                         "(shared memory on a host, TCP between hosts) need nothing else. Leave use_mpi unset.")
    if extra_mpi_args:
        raise ValueError("kolo.spark.run: extra_mpi_args is for mpirun, which kolo does not use; pass "
                         "settings as environment variables instead (env={'KOLO_...': ...})")
    if env is not None:
        if not isinstance(env, dict):
            raise TypeError("kolo.spark.run: env must be a dict of strings, got %s" % type(env).__name__)
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k:
                raise ValueError("kolo.spark.run: env entries must be str names (without '=') to str values; "
                                 "got %r: %r" % (k, v))


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, use_mpi=None, use_gloo=None,
        extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1, nics=None,
        prefix_output_with_timestamp=False, executable=None):
    """Runs fn(*args, **kwargs) on num_proc Spark tasks as the ranks of one kolo job; returns the
    list of their return values, ordered by rank. Horovod's horovod.spark.run signature.

    num_proc: ranks (default: spark.default.parallelism). start_timeout: seconds for the ranks to
    find each other in kolo.init (KOLO_START_TIMEOUT; default 600 here, as Horovod's, since tasks
    may wait for executors). env: variables for the ranks (on top of the executor's). stdout /
    stderr: where the ranks' tagged output goes (default sys.stdout / sys.stderr).
    verbose: 0 quiet, 1 (default) a line when the job starts and ends, 2 also each rank's
    placement. nics: network interfaces for kolo's TCP connections (KOLO_IFACE).
    prefix_output_with_timestamp: prefix each line with the time. executable: the Python the
    ranks run (default the executor's). use_gloo is accepted and changes nothing (kolo has its
    own transports); use_mpi=True and extra_mpi_args are refused.

    Raises KoloSparkError when a rank fails (the first to fail, with its last lines)."""
    kwargs = {} if kwargs is None else kwargs
    _check_args(fn, args, kwargs, num_proc, use_mpi, extra_mpi_args, env)
    sc, cloudpickle = _spark()
    n = num_proc if num_proc is not None else sc.defaultParallelism
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    run_id = uuid.uuid4().hex[:12]
    secret = secrets.token_hex(32)
    group = "kolo.spark.run.%s" % run_id
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    cancelled = threading.Event()

    def on_failure():
        if not cancelled.is_set():
            cancelled.set()
            sc.cancelJobGroup(group)

    col = _Collector(secret, out, err, prefix_output_with_timestamp, on_failure)
    worker_env = dict(env or {})
    if nics:
        worker_env["KOLO_IFACE"] = nics if isinstance(nics, str) else ",".join(nics)
    spec = {
        "run_id": run_id, "secret": secret, "driver": "%s:%d" % (_driver_host(sc), col.port),
        "payload": payload, "env": worker_env, "start_timeout": start_timeout if start_timeout else 600,
        "executable": executable, "verbose": verbose,
    }
    if verbose >= 1:
        print("kolo.spark: starting %d ranks (run %s)" % (n, run_id), file=err, flush=True)
    t0 = time.monotonic()
    # Ctrl-C on the driver stops the ranks: PySpark's own SIGINT handler cancels every job, but
    # its KeyboardInterrupt is lost inside the gateway call, which then fails as a cancelled job.
    # Ours cancels this run's job and lets collect() fail; the KeyboardInterrupt is raised after.
    interrupted = threading.Event()
    old_sigint = None
    if threading.current_thread() is threading.main_thread():
        def on_sigint(signum, frame):
            interrupted.set()
            sc.cancelJobGroup(group)
        old_sigint = signal.signal(signal.SIGINT, on_sigint)
    try:
        sc.setJobGroup(group, "kolo.spark.run: %d ranks" % n, interruptOnCancel=True)
        try:
            rdd = sc.parallelize(range(n), n).barrier().mapPartitions(lambda it: _task(spec))
            pairs = rdd.collect()
        except BaseException as e:
            if not isinstance(e, Exception):  # interrupted some other way: the ranks must not run on
                sc.cancelJobGroup(group)
                col.close(drain_s=0)
            raise
        finally:
            if old_sigint is not None:
                signal.signal(signal.SIGINT, old_sigint)
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)
            sc.setLocalProperty("spark.job.interruptOnCancel", None)
    except Exception as e:
        if interrupted.is_set():
            col.close(drain_s=0)
            raise KeyboardInterrupt("kolo.spark.run was interrupted; its %d ranks were stopped" % n) from None
        col.close()  # the failure reports, and the last lines, may still be on their way
        with col.lock:
            fails = sorted(col.failures)
        if fails:
            # a rank that failed because another was lost or left is not the cause: name the first
            # that failed otherwise (they may report in either order)
            first = next((f for f in fails if not reports_another_rank(f[4])), fails[0])
            fails.remove(first)
            fails.insert(0, first)
            _, rank, host, code, summary, tail = fails[0]
            others = sorted(set(f[1] for f in fails[1:]) - {rank})
            msg = "kolo.spark: rank %d on %s failed (exit code %d): %s" % (rank, host, code, summary)
            if others:
                msg += "\n  after it, rank(s) %s failed too" % ", ".join(map(str, others))
            if tail:
                msg += "\n  its last lines:\n    " + "\n    ".join(tail)
            raise KoloSparkError(msg, rank, host, code, tail) from None
        raise KoloSparkError("kolo.spark: the Spark job of %d ranks failed before any rank reported: %s%s"
                             % (n, _spark_reason(e), " (each rank needs a task slot of its own: "
                                "num_proc=%d)" % n if "SPARK-24819" in str(e) else "")) from e
    col.close()
    pairs.sort(key=lambda p: p[0])
    if [p[0] for p in pairs] != list(range(n)):
        raise KoloSparkError("kolo.spark: expected one result from each of ranks 0..%d, got ranks %s"
                             % (n - 1, [p[0] for p in pairs]))
    if verbose >= 1:
        print("kolo.spark: %d ranks finished in %.1f s" % (n, time.monotonic() - t0), file=err, flush=True)
    return [cloudpickle.loads(p[1]) for p in pairs]



def run_elastic(fn, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None, start_timeout=None,
                elastic_timeout=None, reset_limit=None, env=None, stdout=None, stderr=None, verbose=1, nics=None,
                prefix_output_with_timestamp=False, min_np=None, max_np=None, cooldown_range=None, executable=None):
    """Runs fn(*args, **kwargs) as the workers of an elastic kolo job on Spark's executors until
    the job ends; returns what the workers of its last round returned, by rank. Horovod's
    horovod.spark.run_elastic signature; fn is a script's body under kolorun --min-np (init(),
    state, a loop under kolo.elastic.run that commits).

    num_proc: workers to start with (default spark.default.parallelism); min_num_proc (default
    num_proc): fewest the job goes on with; max_num_proc (default num_proc): Spark tasks that hold
    a slot each, so the most workers. start_timeout: seconds for the first num_proc slots and for a
    round's workers to find each other (default 600); elastic_timeout: seconds to wait for
    min_num_proc slots after losses (default 600, KOLO_ELASTIC_TIMEOUT); reset_limit: end the job
    after that many re-formations; cooldown_range=(min, max): seconds before a host whose worker
    failed gets workers again (default never). env: variables for the workers; stdout/stderr:
    where kolorun's output goes (each worker's lines tagged by rank); nics: KOLO_IFACE;
    executable: the workers' Python (default this one's path). prefix_output_with_timestamp and
    verbose are accepted. Raises KoloSparkError with kolorun's reason when the job fails.

    How (kolo/spark/_elastic.py): kolorun runs on the driver's machine as the job's coordinator;
    max_num_proc Spark tasks are agents that hold a slot each and start the workers kolorun gives
    them, so executors lost or added shrink or grow the job."""
    from kolo import _elastic_driver
    from kolo.spark import _elastic
    kwargs = {} if kwargs is None else kwargs
    _check_args(fn, args, kwargs, num_proc, None, None, env)
    sc, cloudpickle = _spark()
    n = num_proc if num_proc is not None else sc.defaultParallelism
    lo = min_np if min_np is not None else (min_num_proc if min_num_proc is not None else n)
    hi = max_np if max_np is not None else (max_num_proc if max_num_proc is not None else max(n, lo))
    start_timeout = start_timeout if start_timeout else 600
    elastic_timeout = elastic_timeout if elastic_timeout else float(os.environ.get("KOLO_ELASTIC_TIMEOUT", 600))
    _elastic_driver.check_settings("kolo.spark.run_elastic", lo, hi, reset_limit, elastic_timeout, start_timeout,
                                   cooldown_range, nics)
    if not lo <= n <= hi:
        raise ValueError("kolo.spark.run_elastic: num_proc %d must be between min_num_proc %d and max_num_proc %d"
                         % (n, lo, hi))
    backend = _elastic.SparkBackend(start_timeout)
    driver = _driver_host(sc)
    try:
        local = socket.gethostbyname(driver)
    except OSError:
        local = None
    job = _elastic_driver.Job(backend, lo, hi, elastic_timeout, start_timeout, reset_limit=reset_limit,
                              cooldown_range=cooldown_range, env_vars=env, nics=nics, local_address=local,
                              executable=executable)
    payload = cloudpickle.dumps(_Call(fn, tuple(args), dict(kwargs)))
    group = "kolo.spark.run_elastic.%s" % uuid.uuid4().hex[:12]
    err = stderr if stderr is not None else sys.stderr

    def agents(service):
        spec = {"driver": "%s:%d" % (driver, service.port), "key": service.key, "env": dict(env or {})}
        sc.setJobGroup(group, "kolo.spark.run_elastic: %d slots" % hi, interruptOnCancel=True)
        try:
            sc.parallelize(range(hi), hi).mapPartitionsWithIndex(lambda i, it: _elastic.agent_task(spec, i)).collect()
            why = "the Spark tasks that hold the slots all ended (they lost the driver)"
        except Exception as e:  # noqa: BLE001 - cancelled at the job's end, or Spark gave up on a task
            why = "the Spark job of the tasks that hold the slots failed: %s" % _spark_reason(e)
        if not service.closed.is_set():
            backend.gone = why

    if verbose >= 1:
        print("kolo.spark: elastic job of %d workers (%d to %d), %d Spark tasks holding the slots"
              % (n, lo, hi, hi), file=err, flush=True)
    t0 = time.monotonic()
    try:
        results = job.run(payload, stdout=stdout, stderr=stderr, wait_slots=n,
                          on_service=lambda service: threading.Thread(target=agents, args=(service,),
                                                                      daemon=True).start())
    except _elastic_driver.ElasticJobError as e:
        raise KoloSparkError("kolo.spark: the elastic job failed: %s" % e) from None
    finally:
        sc.cancelJobGroup(group)
    if verbose >= 1:
        print("kolo.spark: elastic job finished in %.1f s, %d workers in its last round"
              % (time.monotonic() - t0, len(results)), file=err, flush=True)
    return results


class _Call:
    """fn with its arguments, as the elastic workers call it."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)

# ---- a barrier task ----

class _Channel:
    """The task's end of the output channel; falls back to this process's own streams."""

    def __init__(self, addr, secret):
        self.lock = threading.Lock()
        self.sock = None
        host, _, port = addr.rpartition(":")
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=30)
            self.sock.settimeout(None)
            self.sock.sendall(("kolo.spark %s\n" % secret).encode())
        except OSError as e:
            print("kolo.spark: cannot reach the driver at %s (%s); output stays in this executor's log"
                  % (addr, e), file=sys.stderr, flush=True)
            self.sock = None

    def send(self, line, fallback=None, fallback_text=None):
        with self.lock:
            if self.sock is not None:
                try:
                    self.sock.sendall((line + "\n").encode("utf-8", "replace"))
                    return
                except OSError:
                    self.sock = None
            if fallback is not None:
                fallback.write(line[2:] + "\n" if fallback_text is None else fallback_text)
                fallback.flush()

    def close(self):
        with self.lock:
            if self.sock is not None:
                try:
                    self.sock.close()
                except OSError:
                    pass
                self.sock = None


def _pid_ns():
    """This process's pid namespace (its inode), or 0 where /proc cannot tell."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _sweep_stale_dirs(tmp=None):
    """Removes what tasks of earlier runs on this host left in the temporary directory.

    A task's directory (its rank's payload and result) goes in the task's `finally`, but Spark
    kills a task's Python worker outright when its barrier stage fails or is cancelled, and each
    failed run left one behind. The name says whose it is, kolo-spark-<pid namespace>-<pid>-*:
    one of this user's, from this pid namespace, whose process is gone, is removed. Another
    namespace's (containers sharing /tmp) is left alone: its pids mean nothing here.
    """
    tmp = tmp or tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    prefix = "kolo-spark-%d-" % _pid_ns()
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        path = os.path.join(tmp, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive (another user's), or gone already
            pass


def _task(spec):
    import subprocess
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    partition = ctx.partitionId()
    infos = ctx.getTaskInfos()
    hosts = [i.address.rsplit(":", 1)[0] for i in infos]
    size = len(hosts)
    rank, lrank, lsize, crank, csize = placement(hosts)[partition]
    port = free_port() if partition == 0 else 0
    port = int(ctx.allGather(str(port))[0])
    rdv_host = hosts[0]
    if rdv_host.startswith("[") and rdv_host.endswith("]"):
        rdv_host = rdv_host[1:-1]
    rdv = ("[%s]:%d" if ":" in rdv_host else "%s:%d") % (rdv_host, port)

    chan = _Channel(spec["driver"], spec["secret"])
    if spec["verbose"] >= 2:
        chan.send("E %d kolo.spark: rank %d is partition %d on %s (local %d of %d)"
                  % (rank, rank, partition, hosts[partition], lrank, lsize), sys.stderr)
    _sweep_stale_dirs()
    tmp = tempfile.mkdtemp(prefix="kolo-spark-%d-%d-" % (_pid_ns(), os.getpid()))
    try:
        with open(os.path.join(tmp, "payload"), "wb") as f:
            f.write(spec["payload"])
        env = dict(os.environ)
        env.update(spec["env"])
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in sys.path if p] +
                                            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update({
            "KOLO_RANK": str(rank), "KOLO_SIZE": str(size), "KOLO_LOCAL_RANK": str(lrank),
            "KOLO_LOCAL_SIZE": str(lsize), "KOLO_CROSS_RANK": str(crank), "KOLO_CROSS_SIZE": str(csize),
            "KOLO_RENDEZVOUS": rdv, "KOLO_RENDEZVOUS_SERVER": "rank0",
            "KOLO_SECRET": spec["secret"],
            # a retried barrier stage retries every task: a new attempt number for all of them
            "KOLO_JOB_ID": "spark-%s-s%d-a%d" % (spec["run_id"], ctx.stageId(), ctx.attemptNumber()),
            "KOLO_START_TIMEOUT": str(spec["start_timeout"]),
            "KOLO_SPARK_PARENT": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        })
        exe = spec["executable"] or sys.executable
        child = subprocess.Popen([exe, "-m", "kolo.spark._worker", tmp], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tail = collections.deque(maxlen=_TAIL_LINES)

        def pump(pipe, kind, fallback):
            cut, shown = _Splitter(), ""
            fd = pipe.fileno()
            while True:
                data = os.read(fd, 65536)
                for ends, text in cut.feed(data, final=not data):
                    if ends:
                        tail.append(_visible(shown + text))
                        shown = ""
                        chan.send("%s %d %s" % (kind, rank, text), fallback)
                    else:
                        shown = (shown + text)[-4096:]
                        chan.send("%s %d %s" % (kind.lower(), rank, text), fallback, text)
                if not data:
                    break
            pipe.close()

        pumps = [threading.Thread(target=pump, args=(child.stdout, "O", sys.stdout), daemon=True),
                 threading.Thread(target=pump, args=(child.stderr, "E", sys.stderr), daemon=True)]
        for p in pumps:
            p.start()
        try:
            code = child.wait()
        except BaseException:  # the task is being killed: the rank goes with it
            child.kill()
            child.wait()
            raise
        for p in pumps:
            p.join()
        if code != 0:
            summary = "exited with code %d" % code
            try:
                with open(os.path.join(tmp, "error"), encoding="utf-8", errors="replace") as f:
                    summary = f.read().strip() or summary
            except OSError:
                if code < 0:
                    summary = "killed by signal %d" % -code
            code = code if code >= 0 else 128 - code
            chan.send("X %d %s %d %s %s" % (rank, hosts[partition].replace(" ", "_"), code, _b64(summary),
                                            _b64("\n".join(tail))))
            chan.close()
            raise RuntimeError("kolo.spark: rank %d (partition %d on %s) failed with exit code %d: %s"
                               % (rank, partition, hosts[partition], code, summary))
        chan.close()
        with open(os.path.join(tmp, "result"), "rb") as f:
            result = f.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [(rank, result)]


class _Splitter:
    """A rank's output cut into what the driver shows: (True, text) for a line's (remaining) text
    as the line ends; (False, text) for text of a line that holds a carriage return, as it comes
    (a progress bar ends its line only when done: line by line, the driver saw nothing of it for
    an epoch, then the whole bar at once). UTF-8 split across reads is joined first."""

    def __init__(self):
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._rest = ""     # the current line's text not yet passed on
        self._live = False  # the current line holds a carriage return: passed on as it comes

    def feed(self, data, final=False):
        text = self._rest + self._decode(data, final)
        out = []
        lines = text.split("\n")
        for line in lines[:-1]:
            out.append((True, line))
            self._live = False
        text = lines[-1]
        self._live = self._live or "\r" in text
        if text and self._live and not final:
            out.append((False, text))
            text = ""
        if final and (text or self._live):
            out.append((True, text))  # the last line, unterminated; or a bar's open line closed
            self._live = False
            text = ""
        self._rest = text
        return out


def _visible(line):
    """What a terminal shows of a line that carriage returns rewrote: its last rewrite."""
    line = line[:-1] if line.endswith("\r") else line
    return line.rpartition("\r")[2]


def _b64(text):
    return base64.b64encode(text.encode("utf-8", "replace")).decode()
