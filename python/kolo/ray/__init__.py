"""kolo.ray: run a function as a kolo job on Ray actors, with horovod.ray.RayExecutor's API.

    import ray
    from kolo.ray import RayExecutor

    def train(lr):
        import kolo.torch as hvd
        hvd.init()
        ...                                   # the same code as under kolorun
        return hvd.rank()

    ray.init()                                # or ray.init(address="auto") on a cluster
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4)
    executor.start()
    results = executor.run(train, args=(0.1,))   # one result per rank, by rank
    executor.shutdown()

How. start() reserves the workers' resources in one Ray placement group (PACK for num_workers,
STRICT_SPREAD over num_hosts hosts of num_workers_per_host), starts one actor per worker, orders
them by node so that the ranks of a node are consecutive, and gives each actor kolo's variables:
KOLO_RANK, KOLO_SIZE, the local and cross ranks, KOLO_RENDEZVOUS at rank 0's node and a port
rank 0's actor found free, KOLO_RENDEZVOUS_SERVER=rank0, and a secret and job id made for this
executor. The functions run in the actors themselves (as Horovod's do), so state kept in the actor
(an executable_cls instance, an initialized kolo) lasts from one call to the next. No ssh, no
mpirun: Ray starts the processes, kolo connects them (shared memory on a node, TCP between nodes).

A rank whose function raises leaves the kolo job at once (kolo.shutdown), so the other ranks' calls
fail with "rank r left the job" instead of waiting; a rank whose process dies is seen as lost. The
driver raises KoloRayError naming the rank that failed first (not one that failed because of it),
its node, and its error's last line, after the other ranks report (or after settings.timeout_s,
when ranks that are still busy are stopped). Before each call, if kolo is initialized in no actor
(the functions call kolo.shutdown(), or a run failed), the ranks get a new job id and rendezvous
port, so the next kolo.init() starts a new job.

Elastic jobs: kolo.ray.ElasticRayExecutor (kolo/ray/elastic.py). Not here: GPU workers (kolo
reduces host memory; use_gpu=True is refused).
"""

import os
import secrets
import socket
import sys
import time
import traceback
import uuid

try:
    import ray
    from ray.util.placement_group import (get_current_placement_group, placement_group,
                                          placement_group_table, remove_placement_group)
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("kolo.ray needs Ray (pip install ray): %s" % _e) from None

from kolo._tasks import free_port, placement, reports_another_rank
from kolo.ray import ray_logger

__all__ = ["RayExecutor", "ElasticRayExecutor", "KoloRayError", "ray_logger"]


class KoloRayError(RuntimeError):
    """A rank of a RayExecutor job failed, or the executor could not start its workers. rank,
    node and tail (the failing rank's traceback lines) say which and how, when a rank failed."""

    def __init__(self, msg, rank=None, node=None, tail=()):
        super().__init__(msg)
        self.rank, self.node, self.tail = rank, node, list(tail)


class _Settings:
    """What RayExecutor.create_settings returns."""

    def __init__(self, timeout_s, ssh_identity_file, ssh_str, placement_group_timeout_s, nics):
        self.timeout_s = timeout_s
        self.ssh_identity_file, self.ssh_str = ssh_identity_file, ssh_str
        self.placement_group_timeout_s = placement_group_timeout_s
        self.nics = nics

    def __repr__(self):
        return "RayExecutor settings(timeout_s=%r, placement_group_timeout_s=%r, nics=%r)" % (
            self.timeout_s, self.placement_group_timeout_s, self.nics)


# ---- the worker: one Ray actor per rank ----

class _Worker:
    """A rank's actor. Its methods run one at a time, in the actor's process."""

    def __init__(self, rank):
        self.rank = rank
        self.executable = None

    def __repr__(self):  # Ray's prefix of this actor's output lines: "(kolo rank 1 pid=...)"
        return "kolo rank %d" % self.rank

    def where(self):
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    def free_port(self):
        return free_port()

    def configure(self, env):
        os.environ.update(env)

    def kolo_initialized(self):
        kolo = sys.modules.get("kolo")
        return bool(kolo is not None and kolo.is_initialized())

    def leave(self):
        kolo = sys.modules.get("kolo")
        if kolo is not None and kolo.is_initialized():
            kolo.shutdown()

    def call(self, how, fn, args, kwargs, queue, raise_errors):
        """Runs fn (how: "run": fn(*args, **kwargs); "execute": fn(executable); "make": builds the
        executable). Returns ("ok", value) or ("error", last line, traceback); with raise_errors,
        the value itself, or raises. A failure makes this rank leave the kolo job first, so that the others
        learn of it in their next (or current) collective instead of waiting for it."""
        ray_logger.configure(queue, self.rank)
        try:
            if how == "make":
                self.executable = fn(*args, **kwargs)
                value = None
            elif how == "execute":
                value = fn(self.executable)
            else:
                value = fn(*args, **kwargs)
            return value if raise_errors else ("ok", value)
        except SystemExit as e:  # sys.exit() in the function: 0 is a normal end, as for a script
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if code == 0:
                return None if raise_errors else ("ok", None)
            self.leave()
            if raise_errors:
                raise
            return ("error", "the function called sys.exit(%r)" % (e.code,), "")
        except BaseException as e:  # noqa: B902 - the rank's failure, whatever it is, goes to the driver
            self.leave()
            if raise_errors:
                raise
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            return ("error", last, traceback.format_exc())
        finally:
            ray_logger.configure(None, self.rank)


class RayExecutor:
    """Runs functions on num_workers Ray actors as the ranks of a kolo job
    (horovod.ray.RayExecutor's API; see the module's docstring)."""

    @staticmethod
    def create_settings(timeout_s=30, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100,
                        nics=None):
        """timeout_s: seconds for the ranks to find each other in kolo.init (KOLO_START_TIMEOUT),
        and for the other ranks to report after one failed. placement_group_timeout_s: seconds to
        wait for Ray to reserve the workers' resources. nics: network interfaces for kolo's TCP
        connections (KOLO_IFACE). ssh_identity_file and ssh_str are accepted and unused: Ray
        starts the workers, no ssh is involved."""
        for name, v in (("timeout_s", timeout_s), ("placement_group_timeout_s", placement_group_timeout_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError("RayExecutor.create_settings: %s must be a positive number of seconds, got %r"
                                 % (name, v))
        if nics is not None and not isinstance(nics, (str, list, tuple, set)):
            raise TypeError("RayExecutor.create_settings: nics must be an interface name or a list of them, "
                            "got %s" % type(nics).__name__)
        return _Settings(timeout_s, ssh_identity_file, ssh_str, placement_group_timeout_s, nics)

    def __init__(self, settings=None, num_workers=None, num_hosts=None, num_workers_per_host=1, cpus_per_worker=1,
                 use_gpu=False, gpus_per_worker=None, use_current_placement_group=True, min_workers=None,
                 max_workers=None, reset_limit=None, cooldown_range=None, elastic_timeout=600,
                 override_discovery=True):
        def count(name, v, lowest=1):
            if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
                raise ValueError("RayExecutor: %s must be an integer of at least %d, got %r" % (name, lowest, v))

        if settings is None:
            settings = RayExecutor.create_settings()
        if not isinstance(settings, _Settings):
            raise TypeError("RayExecutor: settings must come from RayExecutor.create_settings(), got %s"
                            % type(settings).__name__)
        if min_workers is not None or max_workers is not None:
            raise ValueError("RayExecutor: min_workers/max_workers: an elastic job on Ray is kolo.ray.ElasticRayExecutor "
                             "(docs/ray.md, \"Elastic jobs\"); RayExecutor runs a fixed num_workers")
        if use_gpu or gpus_per_worker:
            raise ValueError("RayExecutor: use_gpu=True / gpus_per_worker: kolo reduces host memory only (no GPU "
                             "transport yet), so kolo.ray places CPU workers; leave use_gpu unset")
        if num_hosts is None and num_workers is None:
            raise ValueError("RayExecutor: say how many workers: num_workers=N, or num_hosts=H with "
                             "num_workers_per_host=W")
        if num_hosts is not None and num_workers is not None:
            raise ValueError("RayExecutor: give num_workers or num_hosts (with num_workers_per_host), not both")
        if num_hosts is not None:
            count("num_hosts", num_hosts)
            count("num_workers_per_host", num_workers_per_host)
        else:
            count("num_workers", num_workers)
        if isinstance(cpus_per_worker, bool) or not isinstance(cpus_per_worker, (int, float)) or cpus_per_worker < 0:
            raise ValueError("RayExecutor: cpus_per_worker must be a non-negative number, got %r" % (cpus_per_worker,))
        self.settings = settings
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host if num_hosts is not None else None
        self.num_workers = num_workers if num_workers is not None else num_hosts * num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_current_placement_group = use_current_placement_group
        self.workers = []       # by rank
        self.nodes = []         # by rank: the where() of its actor
        self._pg = None
        self._own_pg = False
        self._extra_env = {}
        self._id = uuid.uuid4().hex[:12]
        self._secret = secrets.token_hex(32)
        self._job = 0
        self._broken = None     # why the workers cannot be used (a dead or stopped rank)

    # ---- starting and stopping ----

    def _reserve(self):
        """The placement group and each worker's bundle index."""
        n = self.num_workers
        pg = get_current_placement_group() if self.use_current_placement_group else None
        if pg is not None:  # inside a Ray Tune trial, say: its group holds one bundle per worker
            if len(pg.bundle_specs) < n:
                raise KoloRayError("RayExecutor: the current placement group has %d bundle(s), %d worker(s) need "
                                   "one each (or pass use_current_placement_group=False)"
                                   % (len(pg.bundle_specs), n))
            return pg, False, list(range(n))
        if self.num_hosts is not None:
            bundle = {"CPU": self.cpus_per_worker * self.num_workers_per_host}
            bundles, strategy = [bundle] * self.num_hosts, "STRICT_SPREAD"
            index = [i // self.num_workers_per_host for i in range(n)]
        else:
            bundles, strategy = [{"CPU": self.cpus_per_worker}] * n, "PACK"
            index = list(range(n))
        bundles = [{k: v for k, v in b.items() if v} or {"CPU": 0.001} for b in bundles]
        pg = placement_group(bundles, strategy=strategy, name="kolo-%s" % self._id)
        timeout = self.settings.placement_group_timeout_s
        if not pg.wait(timeout_seconds=timeout):
            remove_placement_group(pg)
            what = ("%d host(s) of %s CPU each (STRICT_SPREAD)" % (self.num_hosts, bundles[0].get("CPU"))
                    if self.num_hosts is not None else "%d worker(s) of %s CPU each" % (n, self.cpus_per_worker))
            raise KoloRayError("RayExecutor: Ray could not reserve %s within %s s (placement_group_timeout_s); the "
                               "cluster has %s available of %s" % (what, timeout, _resources(ray.available_resources()),
                                                                   _resources(ray.cluster_resources())))
        return pg, True, index

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None, extra_env_vars=None):
        """Starts the workers (one actor per rank) and, with executable_cls, builds
        executable_cls(*executable_args, **executable_kwargs) in each, with kolo's variables
        already set (its constructor may call kolo.init()). extra_env_vars: variables for the
        workers' environment."""
        if self.workers:
            raise KoloRayError("RayExecutor.start: already started; call shutdown() first")
        if extra_env_vars is not None and (not isinstance(extra_env_vars, dict) or not all(
                isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in extra_env_vars.items())):
            raise ValueError("RayExecutor.start: extra_env_vars must map variable names (str, without '=') to str "
                             "values, got %r" % (extra_env_vars,))
        if not ray.is_initialized():
            ray.init()
        self._extra_env = dict(extra_env_vars or {})
        self._broken = None
        pg, own, index = self._reserve()
        self._pg, self._own_pg = pg, own
        # the ranks of a node consecutive: each bundle's node is known once the group is placed
        bundle_nodes = placement_group_table(pg).get("bundles_to_node_id", {})
        by_index = placement([bundle_nodes.get(index[i], index[i]) for i in range(self.num_workers)])
        # by rank: (worker index, local rank, local size, cross rank, cross size)
        places = sorted((p[0], i) + tuple(p[1:]) for i, p in enumerate(by_index))
        places = [p[1:] for p in places]
        actor = ray.remote(_Worker)
        self.workers = [actor.options(num_cpus=self.cpus_per_worker, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=index[p[0]])).remote(rank)
            for rank, p in enumerate(places)]
        self._places = places
        try:
            self.nodes = ray.get([w.where.remote() for w in self.workers],
                                 timeout=self.settings.placement_group_timeout_s)
        except BaseException:
            self._broken = "not started"
            self.shutdown()
            raise
        self._new_job()
        if executable_cls is not None:
            self._gather([w.call.remote("make", executable_cls, tuple(executable_args or ()),
                                        dict(executable_kwargs or {}), None, False) for w in self.workers],
                         "start(executable_cls=%s)" % getattr(executable_cls, "__name__", executable_cls), None)

    def _new_job(self):
        """Gives the ranks a new job id and rendezvous port: their next kolo.init() starts a new job."""
        port = ray.get(self.workers[0].free_port.remote())
        ip = self.nodes[0]["ip"]
        rdv = ("[%s]:%d" if ":" in ip else "%s:%d") % (ip, port)
        self._job += 1
        refs = []
        for rank, (w, place) in enumerate(zip(self.workers, self._places)):
            _, lrank, lsize, crank, csize = place
            env = dict(self._extra_env)
            if self.settings.nics:
                nics = self.settings.nics
                env["KOLO_IFACE"] = nics if isinstance(nics, str) else ",".join(sorted(nics))
            env.update({
                "KOLO_RANK": str(rank), "KOLO_SIZE": str(len(self.workers)), "KOLO_LOCAL_RANK": str(lrank),
                "KOLO_LOCAL_SIZE": str(lsize), "KOLO_CROSS_RANK": str(crank), "KOLO_CROSS_SIZE": str(csize),
                "KOLO_RENDEZVOUS": rdv, "KOLO_RENDEZVOUS_SERVER": "rank0", "KOLO_SECRET": self._secret,
                "KOLO_JOB_ID": "ray-%s-%d" % (self._id, self._job),
                "KOLO_START_TIMEOUT": str(self.settings.timeout_s),
            })
            refs.append(w.configure.remote(env))
        ray.get(refs)

    def _release(self):
        if self._pg is not None and self._own_pg:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - Ray itself may be shutting down
                pass
        self._pg, self._own_pg = None, False

    def shutdown(self):
        """Leaves the kolo job in every worker, stops the workers and frees their resources.
        start() may be called again after."""
        if self.workers and self._broken is None:
            try:  # a clean goodbye first: kolo's connections and shared memory closed by kolo itself
                ray.get([w.leave.remote() for w in self.workers], timeout=10)
            except Exception:  # noqa: BLE001 - a busy or dead worker is killed below all the same
                pass
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001
                pass
        self.workers, self.nodes = [], []
        self._release()
        self._broken = None

    # ---- running ----

    def _check(self, what):
        if not self.workers:
            raise KoloRayError("RayExecutor.%s: not started; call start() first" % what)
        if self._broken is not None:
            raise KoloRayError("RayExecutor.%s: the workers cannot be used (%s); call shutdown() and start() again"
                               % (what, self._broken))

    def _prepare(self):
        """Before a call: a new kolo job when no rank is in one (a clean state when only some are)."""
        refs = [w.kolo_initialized.remote() for w in self.workers]
        states = []
        for rank, ref in enumerate(refs):
            try:
                states.append(ray.get(ref))
            except ray.exceptions.RayActorError as e:  # died between calls (killed, its node lost)
                self._broken = "rank %d's worker died" % rank
                raise KoloRayError("kolo.ray: rank %d's worker (on %s) died before this call: %s; call shutdown() and "
                                   "start() again" % (rank, self.nodes[rank]["ip"], str(e).strip().split("\n")[0][:300]),
                                   rank, self.nodes[rank]["ip"]) from None
        if all(states):
            return
        if any(states):
            ray.get([w.leave.remote() for w in self.workers])
        self._new_job()

    def _gather(self, refs, what, callbacks, queue=None):
        """Waits for each rank's ("ok", value) or ("error", ...), calling the callbacks on what the
        ranks log meanwhile; returns the values by rank, or raises KoloRayError for the first rank
        that failed (after the others report, or after settings.timeout_s)."""
        pending = {ref: rank for rank, ref in enumerate(refs)}
        values = [None] * len(refs)
        failures = []  # (time, rank, last line, traceback)
        deadline = None
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.05)
                _drain(queue, callbacks)
                for ref in ready:
                    rank = pending.pop(ref)
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayActorError as e:
                        reason = str(e).strip().split("\n")[0][:300]
                        failures.append((time.monotonic(), rank, "its worker process died (%s)" % reason, ""))
                        self._broken = "rank %d's worker died" % rank
                        continue
                    if out[0] == "ok":
                        values[rank] = out[1]
                    else:
                        failures.append((time.monotonic(), rank, out[1], out[2]))
                if failures and deadline is None:
                    deadline = time.monotonic() + self.settings.timeout_s
                if deadline is not None and pending and time.monotonic() > deadline:
                    stuck = sorted(pending.values())
                    for rank in stuck:
                        ray.kill(self.workers[rank])
                    self._broken = "rank(s) %s were stopped, still busy %s s after rank %d failed" % (
                        ", ".join(map(str, stuck)), self.settings.timeout_s, failures[0][1])
                    failures.append((time.monotonic(), stuck[0], "stopped: still busy %s s after the failure"
                                     % self.settings.timeout_s, ""))
                    break
            _drain(queue, callbacks)
        except KeyboardInterrupt:  # the ranks must not run on without the driver
            for w in self.workers:
                ray.kill(w)
            self._broken = "interrupted"
            raise
        if not failures:
            return values
        first = next((f for f in failures if not reports_another_rank(f[2])), failures[0])
        _, rank, last, tb = first
        others = sorted(set(f[1] for f in failures) - {rank})
        node = self.nodes[rank]
        msg = "kolo.ray: %s: rank %d on %s (%s) failed: %s" % (what, rank, node["hostname"], node["ip"], last)
        if others:
            msg += "\n  after it, rank(s) %s failed too" % ", ".join(map(str, others))
        tail = [ln for ln in tb.rstrip("\n").split("\n") if ln][-20:]
        if tail:
            msg += "\n  its traceback:\n    " + "\n    ".join(tail)
        raise KoloRayError(msg, rank, node["ip"], tail)

    def _queue(self, callbacks):
        if not callbacks:
            return None
        if not all(callable(c) for c in callbacks):
            raise TypeError("RayExecutor: callbacks must be a list of callables")
        from ray.util.queue import Queue
        return Queue()

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        """Runs fn(*args, **kwargs) on every rank; returns the list of their return values, by rank.
        callbacks: callables invoked, on the driver, on every value the ranks send with
        kolo.ray.ray_logger.log() during the run. Raises KoloRayError when a rank fails."""
        self._check("run")
        if not callable(fn):
            raise TypeError("RayExecutor.run: fn must be callable, got %s" % type(fn).__name__)
        self._prepare()
        queue = self._queue(callbacks)
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        try:
            return self._gather([w.call.remote("run", fn, args, kwargs, queue, False) for w in self.workers],
                                "run(%s)" % getattr(fn, "__name__", "fn"), callbacks, queue)
        finally:
            _close(queue)

    def run_remote(self, fn, args=None, kwargs=None):
        """Starts fn(*args, **kwargs) on every rank and returns their Ray object refs, by rank
        (ray.get raises a failing rank's exception)."""
        self._check("run_remote")
        if not callable(fn):
            raise TypeError("RayExecutor.run_remote: fn must be callable, got %s" % type(fn).__name__)
        self._prepare()
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        return [w.call.remote("run", fn, args, kwargs, None, True) for w in self.workers]

    def execute(self, fn, callbacks=None):
        """Runs fn(executable) on every rank, with the executable start(executable_cls=...) built
        there (None without one); returns the values by rank."""
        self._check("execute")
        if not callable(fn):
            raise TypeError("RayExecutor.execute: fn must be callable, got %s" % type(fn).__name__)
        self._prepare()
        queue = self._queue(callbacks)
        try:
            return self._gather([w.call.remote("execute", fn, (), {}, queue, False) for w in self.workers],
                                "execute(%s)" % getattr(fn, "__name__", "fn"), callbacks, queue)
        finally:
            _close(queue)

    def execute_single(self, fn):
        """Runs fn(executable) on rank 0 only and returns its value (no collectives: the other
        ranks are not running)."""
        self._check("execute_single")
        if not callable(fn):
            raise TypeError("RayExecutor.execute_single: fn must be callable, got %s" % type(fn).__name__)
        return self._gather([self.workers[0].call.remote("execute", fn, (), {}, None, False)],
                            "execute_single(%s)" % getattr(fn, "__name__", "fn"), None)[0]


def _drain(queue, callbacks):
    if queue is None:
        return
    while True:
        try:
            _, info = queue.get_nowait()
        except Exception:  # noqa: BLE001 - ray.util.queue.Empty, or the queue is gone
            return
        for cb in callbacks:
            cb(info)


def _close(queue):
    if queue is not None:
        try:
            queue.shutdown()
        except Exception:  # noqa: BLE001
            pass


def _resources(res):
    """Ray's resources as "CPU 2, memory 10.5 GiB"."""
    parts = ["%s %g" % (k, res[k]) for k in ("CPU", "GPU") if k in res]
    if "memory" in res:
        parts.append("memory %.1f GiB" % (res["memory"] / 2**30))
    return ", ".join(parts) or "nothing"


from kolo.ray.elastic import ElasticRayExecutor  # noqa: E402 - it raises this module's KoloRayError
