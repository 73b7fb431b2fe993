"""kolo._elastic_driver: an elastic kolorun job whose hosts and processes come from another
framework (kolo.ray.ElasticRayExecutor, kolo.spark.run_elastic).

kolorun does the elastic part (rounds after failures, growth, removal, --min-np, the elastic
timeout, tagged output, the job's end). The framework gives it:

* hosts: a thread writes backend.nodes() ({address: slots}) into a file every second, which
  kolorun's --host-discovery-script prints;
* processes: kolorun's --ssh is kolo/_relay.py, which asks this driver's service to start a
  worker's command on a host; backend.spawn(host, command) starts a process there that serves
  the command (kolo._relay.serve_command) and says where to reach it, backend.watch() waits
  for it to end and tells when it was lost (the relay then exits 255, as ssh does);
* the function: every worker is `python -m kolo._elastic_task`, which fetches the pickled
  function from the service and sends back its return value (and ray_logger values);
* the workers on the driver's own machine, kolorun's children, are told to the backend every
  second (backend.hold_local(n), from kolorun's status file), so that the framework can hold
  their resources (Ray: a placement group a worker).

The service is one TCP port on every interface; every connection opens with the run's secret
(KOLO_DRIVER_KEY), and a stranger gets no answer (the driver names it on stderr).
"""

import codecs
import json
import os
import pickle
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from kolo import _relay


class ElasticJobError(RuntimeError):
    """The elastic job failed: kolorun's reason."""


class SpawnError(RuntimeError):
    """A backend could not start a worker's process on a host (the relay exits 255 with this)."""


class Service:
    """The driver's end of the relays, the workers and (kolo.spark) the agents."""

    def __init__(self, backend, payload, callbacks):
        self.backend = backend
        self.payload = payload
        self.callbacks = callbacks or []
        self.key = secrets.token_hex(32)
        self.results = {}           # worker id -> (round, rank, value)
        self.lock = threading.Lock()
        self.errors = []            # the callbacks' exceptions
        self.closed = threading.Event()
        self.sock = _relay.listen(128)
        self.port = self.sock.getsockname()[1]
        self.refusals = _relay.Refusals("the elastic job's driver")
        self.handshakes = _relay.Handshakes("the elastic job's driver")
        threading.Thread(target=self._accept, name="kolo elastic driver", daemon=True).start()

    def _accept(self):
        while True:
            got = _relay.accept(self.sock, self.closed.is_set, "the elastic job's driver")
            if got is None:
                return
            self.handshakes.enter(*got)
            threading.Thread(target=self._serve, args=got, daemon=True).start()

    def _serve(self, conn, peer):
        try:
            try:
                hello = self.handshakes.read(conn, _relay.recv_hello)
            except (OSError, _relay.WireError) as e:
                if not self.closed.is_set():
                    self.refusals.say("the elastic job's driver turned away %s:%d (%s)" % (peer[0], peer[1], e))
                return
            if not isinstance(hello, dict) or not secrets.compare_digest(str(hello.get("key", "")), self.key):
                self.refusals.say("the elastic job's driver turned away %s:%d (not this run's secret)" % peer)
                return  # a stranger on the port: no answer
            conn.settimeout(30)  # a worker's request, once it has proven itself: each read as before
            op = hello.get("op")
            if op == "spawn":
                conn.settimeout(None)
                self._spawn(conn, str(hello.get("host")), str(hello.get("command")))
            elif op == "agent" and hasattr(self.backend, "agent"):
                conn.settimeout(None)
                self.backend.agent(conn, hello, self.closed)
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
            if not self.closed.is_set():
                sys.stderr.write("kolo: a request from %s:%d to the elastic job's driver failed: %s\n"
                                 % (peer[0], peer[1], e))
        finally:
            conn.close()

    def _call_back(self, value):
        with self.lock:
            for cb in self.callbacks:
                try:
                    cb(value)
                except Exception as e:  # noqa: BLE001 - raised by run() once the job ends
                    self.errors.append(e)

    def _spawn(self, conn, host, command):
        """Starts the command on host for the relay on conn: answers where to reach it, then
        tells the relay if the process serving it is lost before the command ends."""
        if self.closed.is_set():
            return
        try:
            handle = self.backend.spawn(host, command)
        except SpawnError as e:
            _relay.send_json(conn, _relay.REPLY, {"error": str(e)})
            return
        try:
            _relay.send_json(conn, _relay.REPLY, {"addr": handle.addr, "port": handle.port, "token": handle.token})
            lost = self.backend.watch(handle, self.closed)
            if lost:
                try:
                    _relay.send_json(conn, _relay.EXIT, {"lost": lost})
                except OSError:
                    pass
        finally:
            self.backend.release(handle)

    def close(self):
        self.closed.set()
        try:
            self.sock.close()
        except OSError:
            pass
        if hasattr(self.backend, "close"):
            self.backend.close()


class Handle:
    """Where a worker's process listens for its relay."""

    def __init__(self, addr, port, token, **extra):
        self.addr, self.port, self.token = addr, port, token
        self.__dict__.update(extra)


def find_kolorun():
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
    raise RuntimeError("kolo needs kolorun on this machine to start the ranks: not beside %s nor on PATH (set "
                       "KOLORUN to its path)" % _lib.path)


def check_settings(who, min_np, max_np, reset_limit, elastic_timeout, start_timeout, cooldown_range, nics):
    """Horovod's elastic settings, checked as kolorun would, with who's name in the errors."""
    def count(name, v, lowest=1):
        if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
            raise ValueError("%s: %s must be an integer of at least %d, got %r" % (who, name, lowest, v))
    count("min_num_proc", min_np)
    if max_np is not None:
        count("max_num_proc", max_np, min_np)
    if reset_limit is not None:
        count("reset_limit", reset_limit, 0)
    for name, v in (("elastic_timeout", elastic_timeout), ("timeout_s", start_timeout)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError("%s: %s must be a positive number of seconds, got %r" % (who, name, v))
    if cooldown_range is not None and (len(cooldown_range) != 2 or not 1 <= cooldown_range[0] <= cooldown_range[1]):
        raise ValueError("%s: cooldown_range must be (min, max) seconds with 1 <= min <= max, got %r"
                         % (who, cooldown_range))
    if nics is not None and not isinstance(nics, (str, list, tuple, set)):
        raise TypeError("%s: nics must be an interface name or a list of them" % who)


class Job:
    """One elastic job: kolorun's command line and environment, the discovery file, the run."""

    def __init__(self, backend, min_np, max_np, elastic_timeout, start_timeout, reset_limit=None,
                 cooldown_range=None, env_vars=None, nics=None, local_address=None, executable=None):
        self.backend = backend
        self.min_np, self.max_np = min_np, max_np
        self.elastic_timeout, self.start_timeout = elastic_timeout, start_timeout
        self.reset_limit, self.cooldown_range = reset_limit, cooldown_range
        self.env_vars = dict(env_vars or {})
        self.nics, self.local_address = nics, local_address
        self.executable = executable or sys.executable
        self.kolorun = find_kolorun()

    def _gone(self):
        """Why no host can ever come (the backend's hosts are gone for good), or None."""
        return getattr(self.backend, "gone", None)

    def _write_hosts(self, path):
        """The backend's hosts into the file kolorun's discovery script prints; returns their slots."""
        nodes = sorted(self.backend.nodes().items())
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join("%s:%d\n" % (addr, slots) for addr, slots in nodes))
        os.replace(tmp, path)
        return sum(slots for _, slots in nodes)

    def command(self, hosts, status, slots):
        """kolorun's command line: as many workers as there are slots now, between min_np and
        max_np (Horovod's driver starts that many too)."""
        max_np = self.max_np if self.max_np is not None else 1 << 16
        cmd = [self.kolorun, "-np", str(max(self.min_np, min(max_np, slots))), "--min-np", str(self.min_np),
               "--max-np", str(max_np), "--host-discovery-script", "cat " + shlex.quote(hosts),
               "--ssh", "%s %s" % (sys.executable, os.path.abspath(_relay.__file__)),
               "--elastic-timeout", "%g" % self.elastic_timeout, "--start-timeout", "%g" % self.start_timeout,
               "--status-file", status]
        # the other hosts reach this machine there: its workers use it too, even when the first
        # hosts are all here and no default route says which address the others will use
        addr = self.local_address
        if addr and not addr.startswith("127.") and addr not in ("::1", "localhost"):
            cmd += ["--local-address", addr]
        if self.reset_limit is not None:
            cmd += ["--reset-limit", str(self.reset_limit)]
        if self.cooldown_range:
            cmd += ["--blacklist-cooldown-range", str(self.cooldown_range[0]), str(self.cooldown_range[1])]
        for name in sorted(self.env_vars):
            cmd += ["-x", name]
        return cmd + [self.executable, "-m", "kolo._elastic_task"]

    def run(self, payload, callbacks=None, stdout=None, stderr=None, wait_slots=0, on_service=None):
        """Runs the job to its end; returns what the workers of its last round returned, by
        rank. Raises ElasticJobError with kolorun's reason when it fails. stdout/stderr: file
        objects for kolorun's output (default: this process's). on_service(service) is called
        once the service listens (kolo.spark starts its agents then); kolorun starts when the
        hosts have wait_slots slots, or after start_timeout with what there is."""
        service = Service(self.backend, payload, callbacks)
        tmp = tempfile.mkdtemp(prefix="kolo-elastic-")
        hosts, status = os.path.join(tmp, "hosts"), os.path.join(tmp, "status.json")
        stop = threading.Event()
        discoverer = None
        try:
            if on_service is not None:
                on_service(service)
            deadline = time.monotonic() + self.start_timeout
            while (sum(self.backend.nodes().values()) < wait_slots and time.monotonic() < deadline
                   and not self._gone()):
                time.sleep(0.1)
            if self._gone():
                raise ElasticJobError(self._gone())
            slots = self._write_hosts(hosts)
            proc = None

            def discover():
                while not stop.wait(1.0):
                    try:
                        self._write_hosts(hosts)
                        if hasattr(self.backend, "hold_local"):
                            self.backend.hold_local(_local_workers(status, self.local_address))
                    except Exception as e:  # noqa: BLE001 - the framework busy, say: the file keeps the last list
                        sys.stderr.write("kolo: telling the hosts failed: %s\n" % e)
                    if self._gone() and proc is not None and proc.poll() is None:
                        proc.terminate()  # no host can come back: kolorun would wait out its elastic timeout

            env = dict(os.environ, KOLO_DRIVER_SERVICE=str(service.port), KOLO_DRIVER_KEY=service.key,
                       **self.env_vars)
            if self.nics:
                env["KOLO_IFACE"] = self.nics if isinstance(self.nics, str) else ",".join(sorted(self.nics))
            for stale in ("KOLO_RANK", "KOLO_SIZE", "KOLO_RENDEZVOUS"):  # a driver under kolorun, say
                env.pop(stale, None)
            discoverer = threading.Thread(target=discover, name="kolo elastic discovery", daemon=True)
            discoverer.start()
            pipes = {"stdout": subprocess.PIPE if stdout is not None else None,
                     "stderr": subprocess.PIPE if stderr is not None else None}
            proc = subprocess.Popen(self.command(hosts, status, slots), env=env, **pipes)
            copies = [threading.Thread(target=_copy, args=(src, dst), daemon=True)
                      for src, dst in ((proc.stdout, stdout), (proc.stderr, stderr)) if src is not None]
            for t in copies:
                t.start()
            try:
                code = proc.wait()
            except KeyboardInterrupt:  # kolorun got the Ctrl-C too (one process group): let it end the job
                _end(proc)
                raise
            for t in copies:
                t.join(10)
            if service.errors:
                raise service.errors[0]
            if code != 0 and self._gone():
                raise ElasticJobError(self._gone())
            if code != 0:
                raise ElasticJobError(_reason(status) or "kolorun exited with code %d" % code)
        finally:
            stop.set()
            service.close()
            # a write of the hosts file under way would put it back into the directory being
            # removed (which then stays, with it): let the discoverer finish first
            if discoverer is not None:
                discoverer.join(30)
            shutil.rmtree(tmp, ignore_errors=True)
        # the workers that finished did so in one round (a worker's end forms no more rounds); a
        # worker whose function shut kolo down said no rank or round: those come last, by worker id
        last = max((r[0] for r in service.results.values() if r[0] is not None), default=None)
        kept = [(wid, r) for wid, r in service.results.items() if r[0] in (last, None)]
        kept.sort(key=lambda x: (x[1][1] is None, x[1][1] or 0, int(x[0]) if x[0].isdigit() else 0))
        return [r[2] for _, r in kept]


def _local_workers(status, local_address):
    """How many of kolorun's workers run (or start) on this machine, from its status file: they
    are kolorun's children, which the framework does not count unless told."""
    try:
        with open(status) as f:
            workers = json.load(f).get("workers", [])
    except (OSError, ValueError):
        return None
    return sum(1 for w in workers if w.get("state") in ("starting", "running") and
               (w.get("host") == local_address or w.get("host") in ("localhost", "127.0.0.1")))


def _copy(src, dst):
    # as it comes, not by lines: kolorun passes a progress bar's carriage-return rewrites on as the
    # worker writes them, and a bar ends its line only when done
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    fd = src.fileno()
    while True:
        data = os.read(fd, 65536)
        text = decode(data, not data)
        if text:
            dst.write(text)
            dst.flush()
        if not data:
            break


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

