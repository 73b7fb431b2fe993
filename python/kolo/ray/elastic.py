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
driver's machine (kolo/_elastic_driver.py); Ray gives it hosts and processes: the hosts are Ray's
live nodes, `address:slots` (a node's CPUs // cpus_per_slot, as Horovod's RayHostDiscovery counts),
so nodes that join the cluster grow the job and nodes that leave it shrink it; a worker on
another node is started by a Ray actor there (num_cpus=cpus_per_slot, node affinity) that runs
kolorun's command as sshd would (kolo/_relay.py). A node that dies takes its actors with it: the
relay exits 255, as ssh does when its connection drops, and kolorun counts the worker lost.
Workers on the driver's own node are kolorun's children, as under kolorun alone (no actor); a
placement group each holds their CPUs (hold_local).
"""

import secrets
import threading

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kolo import _relay
from kolo._elastic_driver import ElasticJobError, Handle, Job, SpawnError, check_settings

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
            slots = int(cpus // self.cpus_per_slot)
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
        listener = _relay.listen()
        env = _relay.command_env(self.env)

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


class _RayBackend:
    """Ray's nodes as kolorun's hosts; a worker's process on a node is a Ray actor there."""

    def __init__(self, discovery, cpus_per_slot, env_vars, start_timeout):
        self.discovery, self.cpus_per_slot = discovery, cpus_per_slot
        self.env_vars, self.start_timeout = env_vars, start_timeout
        self.slot = ray.remote(_Slot)
        self.held = []              # placement groups holding the CPUs of the workers beside the driver
        self.here = "node:" + ray.util.get_node_ip_address()

    def nodes(self):
        return {addr: slots for addr, (_, slots) in self.discovery.nodes().items()}

    def spawn(self, host, command):
        node = self.discovery.nodes().get(host)
        if node is None:
            raise SpawnError("no live Ray node has address %s" % host)
        token = secrets.token_hex(16)
        actor = self.slot.options(
            num_cpus=self.cpus_per_slot, max_concurrency=2, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node[0], soft=False)).remote(self.env_vars)
        try:
            addr, port = ray.get(actor.open.remote(token, command), timeout=self.start_timeout)
        except Exception as e:  # noqa: BLE001 - Ray's reasons are many: a full or dying node, a timeout
            _kill(actor)
            if isinstance(e, ray.exceptions.GetTimeoutError):
                raise SpawnError("Ray could not start a worker's actor (%s CPU) on node %s within %s s (timeout_s): "
                                 "its CPUs may be taken by other tasks" % (self.cpus_per_slot, host,
                                                                           self.start_timeout)) from None
            raise SpawnError("starting a worker's actor on node %s failed: %s"
                             % (host, str(e).strip().split("\n")[0][:300])) from None
        return Handle(addr, port, token, actor=actor, host=host)

    def watch(self, handle, closed):
        done = handle.actor.wait.remote()
        while not closed.is_set():
            ready, _ = ray.wait([done], timeout=0.5)
            if ready:
                try:
                    ray.get(done)
                    return None
                except Exception as e:  # noqa: BLE001 - the actor or its node died
                    return "its Ray actor on %s died: %s" % (handle.host, str(e).strip().split("\n")[0][:300])
        return None

    def release(self, handle):
        _kill(handle.actor)

    def hold_local(self, n):
        """The workers on the driver's node are kolorun's children, not actors: one placement
        group of cpus_per_slot CPUs each holds their share of the node, so that Ray does not
        give it to other tasks."""
        if n is None or not self.cpus_per_slot:
            return
        while len(self.held) < n:
            self.held.append(placement_group([{"CPU": self.cpus_per_slot, self.here: 0.001}]))
        while len(self.held) > n:
            _remove(self.held.pop())

    def close(self):
        while self.held:
            _remove(self.held.pop())


def _remove(pg):
    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001 - Ray shutting down
        pass


def _kill(actor):
    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 - gone already
        pass


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
        check_settings("ElasticRayExecutor.create_settings", min_num_proc, max_num_proc, reset_limit, elastic_timeout,
                       timeout_s, cooldown_range, nics)
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
        self._job = None

    def start(self):
        """Connects to Ray (ray.init() when not yet) and finds kolorun."""
        if not ray.is_initialized():
            ray.init()
        st = self.settings
        backend = _RayBackend(self._discovery, self.cpus_per_slot, self.env_vars, st.timeout_s)
        self._job = Job(backend, st.min_num_proc, st.max_num_proc, st.elastic_timeout, st.timeout_s,
                        reset_limit=st.reset_limit, cooldown_range=st.cooldown_range, env_vars=self.env_vars,
                        nics=st.nics, local_address=ray.util.get_node_ip_address())

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
        if self._job is None:
            raise KoloRayError("ElasticRayExecutor.run: not started; call start() first")
        try:
            return self._job.run(ray.cloudpickle.dumps(worker_fn), callbacks)
        except ElasticJobError as e:
            raise KoloRayError("kolo.ray: the elastic job failed: %s" % e) from None
