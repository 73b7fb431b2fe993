"""kolo.ray.ElasticRayExecutor: an elastic kolo job on a Ray cluster (horovod.ray.ElasticRayExecutor's API).

    import ray
    from kolo.ray import ElasticRayExecutor

    def train():
        import kolo.torch as hvd
        hvd.init()
        ...
        @hvd.elastic.run
        def loop(state): ...
        loop(state)
        return hvd.rank()

    ray.init(address="auto")
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=8)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    results = executor.run(train)       # what the last round's workers returned, by rank

How. The job is a kolorun elastic job (docs/kolorun.md, "Elastic jobs") that kolorun runs on the
driver's machine; Ray gives it hosts and processes:

* the hosts: a thread of the driver writes Ray's live nodes into a file every second, as
  `address:slots` (a node's CPUs // cpus_per_slot, as Horovod's RayHostDiscovery counts), and
  kolorun's --host-discovery-script reads it: nodes that join the cluster grow the job, nodes
  that leave it shrink it;
* the processes: kolorun starts a worker on a remote node through its --ssh program, here
  kolo/_relay.py, which asks this driver's service to start it; the service starts a Ray actor
  on that node (num_cpus=cpus_per_slot) that runs the command as sshd would and relays its
  stdin, stdout, stderr and exit status. A node that dies takes its actors with it: the relay
  exits 255, as ssh does when its connection drops, and kolorun counts the worker lost. Workers
  on the driver's own node are kolorun's children, as under kolorun alone (no actor);
* the function: each worker is `python -m kolo._elastic_task`, which fetches worker_fn from the
  service, runs it and sends back its return value; kolo.ray.ray_logger.log() values reach the
  callbacks the same way.

kolorun forms the rounds (failures, growth, removal, --min-np, --elastic-timeout, --reset-limit),
prints every worker's output tagged by rank, and ends the job; its status file names the
failure that ended it, which run() raises as KoloRayError.
"""

import json
import os
import pickle
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kolo import _relay

__all__ = ["ElasticRayExecutor", "RayHostDiscovery"]


class _ElasticSettings:
    """What ElasticRayExecutor.create_settings returns."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.discovery = None

    def __repr__(self):
        return "ElasticRayExecutor settings(%s)" % ", ".join(
            "%s=%r" % (k, v) for k, v in sorted(self.__dict__.items()) if k != "discovery")


class RayHostDiscovery:
    """The cluster's live nodes as {address: slots}: a node's CPUs // cpus_per_slot (Horovod's
    RayHostDiscovery). A node of fewer CPUs than a slot is left out."""

    def __init__(self, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None):
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot

    def nodes(self):
        """{address: (node id, slots)} of the live nodes with at least one slot."""
        out = {}
        for node in ray.nodes():
            if not node.get("Alive", node.get("alive")):
                continue
            cpus = node.get("Resources", {}).get("CPU", 0)
            slots = int(cpus // self.cpus_per_slot) if self.cpus_per_slot else int(cpus)
            addr = node["NodeManagerAddress"]
            if slots >= 1 and addr not in out:
                out[addr] = (node["NodeID"], slots)
        return out

    def find_available_hosts_and_slots(self):
        return {addr: slots for addr, (_, slots) in self.nodes().items()}


class _Slot:
    """A worker's process on a node: runs kolorun's remote command for the relay (kolo/_relay.py)."""

    def __init__(self, env):
        self.env = env
        self.done = threading.Event()
        self.code = None

    def __repr__(self):  # Ray's prefix of this actor's own lines (the worker's go through kolorun)
        return "kolo elastic slot"

    def open(self, token, command):
        """Listens for the relay on a free port; returns (address, port)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("0.0.0.0", 0))
        listener.listen(4)
        env = dict(os.environ, **self.env)
        # kolo importable by the command's python, as it is by this actor's
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(_relay.__file__))))
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])

        def serve():
            try:
                self.code = _relay.serve_command(listener, token, command, env)
            finally:
                self.done.set()

        threading.Thread(target=serve, daemon=True).start()
        return ray.util.get_node_ip_address(), listener.getsockname()[1]

    def wait(self):
        self.done.wait()
        return self.code


class _Service:
    """The driver's end: kolorun's relays ask it to start workers, the workers fetch the function
    and send their results and logged values. One TCP port on every interface, a secret."""

    def __init__(self, executor, payload, callbacks):
        self.ex = executor
        self.payload = payload
        self.callbacks = callbacks or []
        self.key = secrets.token_hex(32)
        self.results = {}           # worker id -> (round, rank, value)
        self.actors = {}            # token -> actor
        self.lock = threading.Lock()
        self.cb_lock = threading.Lock()
        self.errors = []            # callbacks' exceptions
        self.closed = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(30)
        try:
            hello = _relay.recv_json(conn, _relay.HELLO)
            if not isinstance(hello, dict) or not secrets.compare_digest(str(hello.get("key", "")), self.key):
                return  # a stranger on the port: no answer
            op = hello.get("op")
            if op == "spawn":
                conn.settimeout(None)
                self._spawn(conn, hello)
            elif op == "fn":
                _relay.send(conn, _relay.DATA, self.payload)
            elif op in ("result", "log"):
                kind, data = _relay.recv(conn)
                if kind != _relay.DATA:
                    raise _relay.WireError("no value after the %s request" % op)
                value = pickle.loads(data)
                if op == "result":
                    with self.lock:
                        self.results[str(hello.get("worker"))] = (hello.get("round"), hello.get("rank"), value)
                else:
                    self._call_back(value)
                _relay.send_json(conn, _relay.REPLY, {})
            else:
                _relay.send_json(conn, _relay.REPLY, {"error": "unknown request %r" % (op,)})
        except (OSError, _relay.WireError, ValueError, pickle.UnpicklingError, EOFError) as e:
            sys.stderr.write("kolo.ray: a request to the elastic driver failed: %s\n" % e)
        finally:
            conn.close()

    def _call_back(self, value):
        with self.cb_lock:
            for cb in self.callbacks:
                try:
                    cb(value)
                except Exception as e:  # noqa: BLE001 - reported by run() once the job ends
                    self.errors.append(e)

    def _spawn(self, conn, hello):
        """Starts an actor on the node at hello's host for the relay on conn; answers where it
        listens, then tells the relay if the actor dies before its command ends."""
        host, command = hello.get("host"), hello.get("command")
        node = self.ex._discovery.nodes().get(host)
        if node is None:
            _relay.send_json(conn, _relay.REPLY, {"error": "no live Ray node has address %s" % host})
            return
        token = secrets.token_hex(16)
        actor = ray.remote(_Slot).options(
            num_cpus=self.ex.cpus_per_slot, max_concurrency=2, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node[0], soft=False)).remote(self.ex.env_vars)
        with self.lock:
            if self.closed:
                ray.kill(actor)
                return
            self.actors[token] = actor
        try:
            addr, port = ray.get(actor.open.remote(token, command), timeout=self.ex.settings.timeout_s)
        except Exception as e:  # noqa: BLE001 - Ray's reasons are many: a full or dying node, a timeout
            self._drop(token)
            why = str(e).strip().split("\n")[0][:300]
            if isinstance(e, ray.exceptions.GetTimeoutError):
                why = ("Ray could not start a worker's actor (%s CPU) on node %s within %s s (timeout_s): its CPUs "
                       "may be taken by other tasks" % (self.ex.cpus_per_slot, host, self.ex.settings.timeout_s))
            _relay.send_json(conn, _relay.REPLY, {"error": why})
            return
        _relay.send_json(conn, _relay.REPLY, {"addr": addr, "port": port, "token": token})
        done = actor.wait.remote()
        while True:
            ready, _ = ray.wait([done], timeout=0.5)
            if ready:
                try:
                    ray.get(done)
                except Exception as e:  # noqa: BLE001 - the actor or its node died
                    try:
                        _relay.send_json(conn, _relay.EXIT, {"lost": "its Ray actor on %s died: %s" % (
                            host, str(e).strip().split("\n")[0][:300])})
                    except OSError:
                        pass
                break
            if self.closed:
                break
        self._drop(token)

    def _drop(self, token):
        with self.lock:
            actor = self.actors.pop(token, None)
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - gone already
                pass

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            tokens = list(self.actors)
        for t in tokens:
            self._drop(t)


def _kolorun():
    """kolorun: KOLORUN, else beside the libkolo this process loaded (a build tree's build/bin or
    an install's PREFIX/bin), else on PATH."""
    if os.environ.get("KOLORUN"):
        return os.environ["KOLORUN"]
    from kolo import _lib
    if os.path.sep in _lib.path:
        beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(_lib.path))), "bin", "kolorun")
        if os.access(beside, os.X_OK):
            return beside
    found = shutil.which("kolorun")
    if found:
        return found
    raise RuntimeError("kolo.ray.ElasticRayExecutor needs kolorun on the driver's machine: not beside %s nor on PATH "
                       "(set KOLORUN to its path)" % _lib.path)


class ElasticRayExecutor:
    """An elastic kolo job on a Ray cluster (horovod.ray.ElasticRayExecutor's API; the module's
    docstring says how it works)."""

    @staticmethod
    def create_settings(min_num_proc=1, max_num_proc=None, reset_limit=None, elastic_timeout=600, timeout_s=30,
                        ssh_identity_file=None, nics=None, min_np=None, max_np=None, cooldown_range=None,
                        verbose=None, **kwargs):
        """min_num_proc: workers below which the job waits for more (kolorun --min-np); max_num_proc:
        at most this many (default: every slot the cluster has); reset_limit: end the job after
        this many re-formations; elastic_timeout: seconds to wait for min_num_proc slots;
        timeout_s: seconds for a round's workers to find each other and for Ray to start a
        worker's actor; nics: interfaces for kolo's TCP connections (KOLO_IFACE); cooldown_range:
        (min, max) seconds before a failed node gets workers again (default: never).
        min_np/max_np are Horovod's older names. ssh_identity_file is accepted and unused."""
        min_num_proc = min_np if min_np is not None else min_num_proc
        max_num_proc = max_np if max_np is not None else max_num_proc

        def count(name, v, lowest=1):
            if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
                raise ValueError("ElasticRayExecutor.create_settings: %s must be an integer of at least %d, got %r"
                                 % (name, lowest, v))
        count("min_num_proc", min_num_proc)
        if max_num_proc is not None:
            count("max_num_proc", max_num_proc, min_num_proc)
        if reset_limit is not None:
            count("reset_limit", reset_limit, 0)
        for name, v in (("elastic_timeout", elastic_timeout), ("timeout_s", timeout_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError("ElasticRayExecutor.create_settings: %s must be a positive number of seconds, got %r"
                                 % (name, v))
        if cooldown_range is not None and (len(cooldown_range) != 2 or not 1 <= cooldown_range[0] <= cooldown_range[1]):
            raise ValueError("ElasticRayExecutor.create_settings: cooldown_range must be (min, max) seconds with "
                             "1 <= min <= max, got %r" % (cooldown_range,))
        if nics is not None and not isinstance(nics, (str, list, tuple, set)):
            raise TypeError("ElasticRayExecutor.create_settings: nics must be an interface name or a list of them")
        unknown = sorted(set(kwargs) - {"ssh_port", "ssh_str", "key", "start_timeout", "output_filename",
                                        "prefix_output_with_timestamp"})
        if unknown:
            raise TypeError("ElasticRayExecutor.create_settings: unknown setting(s) %s" % ", ".join(unknown))
        return _ElasticSettings(min_num_proc=min_num_proc, max_num_proc=max_num_proc, reset_limit=reset_limit,
                                elastic_timeout=elastic_timeout, timeout_s=timeout_s, nics=nics,
                                cooldown_range=tuple(cooldown_range) if cooldown_range else None,
                                verbose=verbose, ssh_identity_file=ssh_identity_file)

    def __init__(self, settings, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None, env_vars=None,
                 override_discovery=True):
        if not isinstance(settings, _ElasticSettings):
            raise TypeError("ElasticRayExecutor: settings must come from ElasticRayExecutor.create_settings(), got %s"
                            % type(settings).__name__)
        if use_gpu or gpus_per_slot:
            raise ValueError("ElasticRayExecutor: use_gpu=True / gpus_per_slot: kolo reduces host memory only (no GPU "
                             "transport yet), so kolo.ray places CPU workers; leave use_gpu unset")
        if isinstance(cpus_per_slot, bool) or not isinstance(cpus_per_slot, (int, float)) or cpus_per_slot <= 0:
            raise ValueError("ElasticRayExecutor: cpus_per_slot must be a positive number, got %r" % (cpus_per_slot,))
        if env_vars is not None and (not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env_vars.items())):
            raise ValueError("ElasticRayExecutor: env_vars must map variable names (str, without '=') to str values, "
                             "got %r" % (env_vars,))
        if override_discovery or settings.discovery is None:
            settings.discovery = RayHostDiscovery(cpus_per_slot=cpus_per_slot)
        self.settings = settings
        self.cpus_per_slot = cpus_per_slot
        self.env_vars = dict(env_vars or {})
        self._discovery = settings.discovery
        self._dir = None

    def start(self):
        """Connects to Ray (ray.init() when not yet) and checks that kolorun is here."""
        if not ray.is_initialized():
            ray.init()
        self._kolorun = _kolorun()
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="kolo-ray-elastic-")

    def _write_hosts(self, path):
        """The cluster's nodes into the file kolorun's discovery script prints; returns their slots."""
        nodes = sorted(self._discovery.nodes().items())
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join("%s:%d\n" % (addr, slots) for addr, (_, slots) in nodes))
        os.replace(tmp, path)
        return sum(slots for _, (_, slots) in nodes)

    def _command(self, hosts, status, slots):
        """kolorun's command line: as many workers as the cluster has slots now, between
        min_num_proc and max_num_proc (Horovod's driver starts that many too)."""
        s = self.settings
        max_np = s.max_num_proc if s.max_num_proc is not None else 1 << 16
        np = max(s.min_num_proc, min(max_np, slots))
        cmd = [self._kolorun, "-np", str(np), "--min-np", str(s.min_num_proc), "--max-np", str(max_np),
               "--host-discovery-script", "cat " + _quote(hosts),
               "--ssh", "%s %s" % (sys.executable, os.path.abspath(_relay.__file__)),
               "--elastic-timeout", "%g" % s.elastic_timeout, "--start-timeout", "%g" % s.timeout_s,
               "--status-file", status]
        # the nodes reach this machine at its Ray address: its workers use it too, even when the
        # first nodes are all here and no default route says which address the others will use
        addr = ray.util.get_node_ip_address()
        if addr and not addr.startswith("127.") and addr not in ("::1", "localhost"):
            cmd += ["--local-address", addr]
        if s.reset_limit is not None:
            cmd += ["--reset-limit", str(s.reset_limit)]
        if s.cooldown_range:
            cmd += ["--blacklist-cooldown-range", str(s.cooldown_range[0]), str(s.cooldown_range[1])]
        for name in sorted(self.env_vars):
            cmd += ["-x", name]
        return cmd + [sys.executable, "-m", "kolo._elastic_task"]

    def run(self, worker_fn, callbacks=None):
        """Runs worker_fn() as every worker of an elastic job until the job ends; returns what the
        workers of its last round returned, by rank. callbacks are called, on the driver, with
        every value rank 0 sends by kolo.ray.ray_logger.log(). Raises KoloRayError when the job
        fails (the reason kolorun gives: the failing worker, its host and exit)."""
        from kolo.ray import KoloRayError
        if not callable(worker_fn):
            raise TypeError("ElasticRayExecutor.run: worker_fn must be callable, got %s" % type(worker_fn).__name__)
        if callbacks is not None and not all(callable(c) for c in callbacks):
            raise TypeError("ElasticRayExecutor.run: callbacks must be a list of callables")
        if self._dir is None:
            raise KoloRayError("ElasticRayExecutor.run: not started; call start() first")
        payload = ray.cloudpickle.dumps(worker_fn)
        service = _Service(self, payload, callbacks)
        hosts, status = os.path.join(self._dir, "hosts"), os.path.join(self._dir, "status.json")
        slots = self._write_hosts(hosts)
        stop = threading.Event()

        def discover():
            while not stop.wait(1.0):
                try:
                    self._write_hosts(hosts)
                except Exception as e:  # noqa: BLE001 - Ray's GCS busy, say: the file keeps the last list
                    sys.stderr.write("kolo.ray: listing the cluster's nodes failed: %s\n" % e)

        env = dict(os.environ, KOLO_RAY_SERVICE=str(service.port), KOLO_RAY_KEY=service.key, **self.env_vars)
        if self.settings.nics:
            nics = self.settings.nics
            env["KOLO_IFACE"] = nics if isinstance(nics, str) else ",".join(sorted(nics))
        for stale in ("KOLO_RANK", "KOLO_SIZE", "KOLO_RENDEZVOUS"):
            env.pop(stale, None)
        threading.Thread(target=discover, daemon=True).start()
        proc = subprocess.Popen(self._command(hosts, status, slots), env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # kolorun got the Ctrl-C too (one process group); let it end the job
            _end(proc)
            raise
        finally:
            stop.set()
            service.close()
        if service.errors:
            raise service.errors[0]
        if code != 0:
            reason = _reason(status) or "kolorun exited with code %d" % code
            raise KoloRayError("kolo.ray: the elastic job failed: %s" % reason)
        # the workers that finished did so in one round (a worker's end forms no more rounds)
        results = list(service.results.values())
        last = max((r[0] or 0 for r in results), default=0)
        return [v for _, _, v in sorted((r for r in results if (r[0] or 0) == last), key=lambda r: r[1] or 0)]


def _end(proc):
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(sig)
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def _reason(status):
    try:
        with open(status) as f:
            return json.load(f).get("reason")
    except (OSError, ValueError):
        return None


def _quote(s):
    return "'" + s.replace("'", "'\\''") + "'"
