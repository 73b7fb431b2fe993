"""kolo.run: a function run by N ranks of a kolo job, started from Python (Horovod's horovod.run).

    import kolo
    def train(lr):
        import kolo.torch as hvd
        hvd.init()
        ...
        return hvd.rank(), final_loss
    results = kolo.run(train, args=(0.1,), num_proc=4)       # [(0, ...), (1, ...), ...] by rank

The driver (this process) serialises (func, args, kwargs) with cloudpickle (pickle where
cloudpickle is missing: then func must be importable by the ranks), starts the job with kolorun
(`kolorun -np N [-H hosts] python -c '...kolo.runner._rank_main()'`) and serves one TCP port: each rank connects,
proves it holds the run's token, fetches the function, runs it and sends back its return value,
or the exception it raised. kolorun's tagged output of the ranks goes to this process's stdout
and stderr. A rank that fails fails the run: RuntimeError naming the first rank that failed on
its own (not one that failed because another was lost) and its exception; kolorun stops the
others, as in any job.

The ranks must be able to import kolo and whatever the function needs: local ranks inherit this
process's environment; remote ones get PYTHONPATH from it (kolorun -x) and find the rest on their
host, as with horovodrun.
"""

import hmac
import json
import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import traceback
import warnings

from kolo import _relay
from kolo._tasks import Server, check_call, reports_another_rank

_ENV_DRIVER = "KOLO_RUN_DRIVER"
_ENV_TOKEN = "KOLO_RUN_TOKEN"


def _pickler():
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        return pickle


def _payload(func, args, kwargs):
    """(pickler, the bytes the ranks fetch). Without cloudpickle, pickle sends a function by name,
    and the ranks (other processes) cannot import one defined in the driver's script or inside
    another function: that is said here, not as the ranks' AttributeError."""
    pickler = _pickler()
    name = getattr(func, "__qualname__", repr(func))
    if pickler is pickle:
        where = ("as a lambda" if "<lambda>" in name else
                 "inside another function" if "<locals>" in name else
                 "in the script run as __main__" if getattr(func, "__module__", None) == "__main__" else None)
        if where:
            raise ValueError("kolo.run: %s cannot reach the ranks: without cloudpickle, Python's pickle sends a "
                             "function by name, and the ranks cannot import one defined %s; install cloudpickle "
                             "(pip install cloudpickle; Debian: python3-cloudpickle), which sends it by value as "
                             "horovod.run does, or define it in a module the ranks import" % (name, where))
    try:
        return pickler, pickler.dumps((func, tuple(args), dict(kwargs)))
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ValueError("kolo.run: cannot pickle %s with its arguments for the ranks: %s" % (name, e)) from e


def _refuse(what, why):
    raise ValueError("kolo.run: %s: %s" % (what, why))


def _local(host):
    """Whether a host of the list is this machine (kolorun starts its ranks without ssh)."""
    name = host.split(":")[0].strip()
    if name in ("localhost", socket.gethostname()) or name.startswith("127."):
        return True
    try:
        mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        theirs = {a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)}
    except OSError:
        return False
    return bool(theirs & (mine | {"127.0.0.1"}))


def _address_towards(host):
    """This machine's address on the route to host (a UDP connect sends nothing)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host.split(":")[0].strip(), 9))
        return s.getsockname()[0]
    finally:
        s.close()


def _hosts_of(hosts, hostfile):
    if hosts:
        return [h for h in hosts.split(",") if h.strip()]
    if hostfile:
        with open(hostfile) as f:
            return [line.split()[0] for line in f if line.split() and not line.lstrip().startswith("#")]
    return []


class _Service(Server):
    """The driver's port: hands each rank the function and takes its result."""

    def __init__(self, n, payload, token, bind):
        self.n, self.payload, self.token = n, payload, token
        self.results, self.failures, self.lock = {}, {}, threading.Lock()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, 0))
        sock.listen(min(max(n, 4), 1024))
        self._listen(sock, "kolo.run service")

    def _serve(self, conn):
        try:
            hello = self.handshakes.read(conn, _relay.recv_hello)  # a rank sends its hello at once; a stranger gets 10 s
            if not isinstance(hello, dict) or not hmac.compare_digest(str(hello.get("token", "")), self.token):
                return  # a stranger, or another run's rank: nothing said
            rank = hello.get("rank")
            if not isinstance(rank, int) or not 0 <= rank < self.n:
                return
            conn.settimeout(None)
            _relay.send(conn, _relay.DATA, self.payload)
            kind, body = _relay.recv(conn)  # the function runs meanwhile, however long it takes
            if kind == _relay.DATA:
                with self.lock:
                    self.results[rank] = body
            elif kind == _relay.EXIT:
                with self.lock:
                    self.failures[rank] = json.loads(body)
        except (OSError, ValueError, _relay.WireError):
            pass
        finally:
            conn.close()

    def close(self, wait_s=10.0):
        """After the job: the ranks have exited, but what they sent last may still wait in the
        backlog or in a connection not yet read: taken before the service stops."""
        self._stop(wait_s, take_queued=True)


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None, slots=None,
        reset_limit=None, cooldown_range=None, hosts=None, hostfile=None, host_discovery_script=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None, output_filename=None,
        verbose=None, use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None,
        network_interfaces=None, executable=None, np=None, min_np=None, max_np=None):
    """Runs func(*args, **kwargs) on num_proc ranks of one kolo job and returns their return
    values as a list ordered by rank. Horovod's horovod.run signature.

    hosts ("h1:2,h2:4") or hostfile: where the ranks run (default: num_proc on this machine);
    start_timeout, ssh_port, ssh_identity_file, output_filename, verbose and network_interfaces
    are kolorun's options of those names; executable: the Python the ranks run (default this
    one's). use_gloo and disable_cache are accepted and change nothing (kolo has its own
    transports and runs no start-up checks to cache); use_mpi=True and mpi_args are refused, as are
    the elastic arguments (min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
    host_discovery_script: start elastic jobs with kolorun's options of those names).

    Raises RuntimeError when a rank fails: the first rank that failed on its own, and its
    exception."""
    if np is not None:
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, stacklevel=2)
        num_proc = np
    if network_interface:
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning,
                      stacklevel=2)
        network_interfaces = network_interface.split(",")
    if min_np is not None or max_np is not None:
        min_num_proc = min_np if min_np is not None else min_num_proc
        max_num_proc = max_np if max_np is not None else max_num_proc
    kwargs = {} if kwargs is None else kwargs
    if num_proc is None:
        raise ValueError("kolo.run: num_proc must be a positive integer, got None")
    check_call("kolo.run", func, args, kwargs, num_proc)
    for name, v in (("min_num_proc", min_num_proc), ("max_num_proc", max_num_proc), ("slots", slots),
                    ("reset_limit", reset_limit), ("cooldown_range", cooldown_range),
                    ("host_discovery_script", host_discovery_script)):
        if v is not None:
            _refuse(name, "elastic jobs start with kolorun (--min-np, --max-np, --host-discovery-script, ...: "
                    "docs/kolorun.md, 'Elastic jobs'), or with kolo.ray / kolo.spark's run_elastic")
    if use_mpi:
        _refuse("use_mpi=True", "kolo does not run over MPI; its own transports need nothing else")
    if mpi_args:
        _refuse("mpi_args", "they are for mpirun, which kolo does not use")
    if hosts and hostfile:
        _refuse("hosts and hostfile", "give one of them")

    kolorun = _find_kolorun()
    remote = [h for h in _hosts_of(hosts, hostfile) if not _local(h)]
    try:
        here = _address_towards(remote[0]) if remote else "127.0.0.1"  # where the ranks reach this process
    except OSError as e:
        raise ValueError("kolo.run: no route from this machine to host %r: %s" % (remote[0], e)) from None
    pickler, payload = _payload(func, args, kwargs)
    token = secrets.token_hex(16)
    service = _Service(num_proc, payload, token, "0.0.0.0" if remote else "127.0.0.1")
    driver = "%s:%d" % (here, service.port)
    cmd = [kolorun, "-np", str(num_proc)]
    if hosts:
        cmd += ["-H", hosts]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    if start_timeout is not None:
        cmd += ["--start-timeout", "%g" % start_timeout]
    if ssh_port is not None:
        cmd += ["-p", str(ssh_port)]
    if ssh_identity_file:
        cmd += ["-i", ssh_identity_file]
    if output_filename:
        cmd += ["--output-filename", output_filename]
    if verbose:
        cmd += ["--verbose"]
    if network_interfaces:
        nics = network_interfaces if isinstance(network_interfaces, str) else ",".join(network_interfaces)
        cmd += ["--network-interfaces", nics]
    cmd += ["-x", "%s=%s" % (_ENV_DRIVER, driver), "-x", "%s=%s" % (_ENV_TOKEN, token)]
    if remote and os.environ.get("PYTHONPATH"):
        cmd += ["-x", "PYTHONPATH"]
    cmd += ["--", executable or sys.executable, "-c", "from kolo.runner import _rank_main; _rank_main()"]
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kolo importable by local ranks
    env["PYTHONPATH"] = pkg + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        code = subprocess.call(cmd, env=env)
    finally:
        service.close()
    with service.lock:
        results, failures = dict(service.results), dict(service.failures)
    if failures:
        ranks = sorted(failures)
        first = next((r for r in ranks if not reports_another_rank(failures[r]["error"])), ranks[0])
        f = failures[first]
        msg = "kolo.run: rank %d failed: %s" % (first, f["error"])
        others = [r for r in ranks if r != first]
        if others:
            msg += "\n  after it, rank(s) %s failed too" % ", ".join(map(str, others))
        raise RuntimeError(msg + "\n  its traceback:\n" + f["traceback"].rstrip())
    if code != 0:
        raise RuntimeError("kolo.run: the job of %d ranks failed (kolorun exited with code %d; its report is "
                           "above)" % (num_proc, code))
    missing = [r for r in range(num_proc) if r not in results]
    if missing:
        raise RuntimeError("kolo.run: rank(s) %s ended without returning a result (did func exit the process?)"
                           % ", ".join(map(str, missing)))
    return [pickler.loads(results[r]) for r in range(num_proc)]


def _find_kolorun():
    from kolo._elastic_driver import find_kolorun
    return find_kolorun()


def _rank_main():
    """A rank of kolo.run: fetch the function from the driver, run it, send back what came of it."""
    driver, token = os.environ.get(_ENV_DRIVER), os.environ.get(_ENV_TOKEN)
    rank = int(os.environ.get("KOLO_RANK", "0"))
    if not driver or not token:
        sys.exit("kolo.runner: run by kolo.run (%s and %s unset)" % (_ENV_DRIVER, _ENV_TOKEN))
    host, port = driver.rsplit(":", 1)
    conn = _relay.connect(host, int(port))
    _relay.send_json(conn, _relay.HELLO, {"token": token, "rank": rank})
    kind, payload = _relay.recv(conn)
    if kind != _relay.DATA:
        sys.exit("kolo.runner: rank %d: the driver at %s sent no function" % (rank, driver))
    pickler = _pickler()
    try:
        func, args, kwargs = pickler.loads(payload)
        result = pickler.dumps(func(*args, **kwargs))
    except BaseException as e:  # noqa: B902 (SystemExit and KeyboardInterrupt too: the driver is told)
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _relay.send_json(conn, _relay.EXIT, {"error": "%s: %s" % (type(e).__name__, e), "traceback": tb})
        conn.close()
        sys.exit(1)
    _relay.send(conn, _relay.DATA, result)
    conn.close()

