"""kolo.ray.RayExecutor on a local Ray cluster (one node, started by this module with 4 logical
CPUs on this 2-core machine). Run outside kolorun with a python that has Ray (scripts/deps-ray.sh
makes one); the executor starts the ranks as Ray actors itself."""

import os
import re
import sys
import time

import pytest

pytestmark = pytest.mark.standalone
ray = pytest.importorskip("ray")

import _training  # noqa: E402
from kolo.ray import KoloRayError, RayExecutor, ray_logger  # noqa: E402

# The actors cannot import this file: its functions travel by value (an application ships its
# modules with Ray's runtime_env, or installs them on the nodes)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(_training)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, logging_level="error", log_to_driver=True)
    yield
    ray.shutdown()


@pytest.fixture
def executor(cluster):
    made = []

    def make(n=2, timeout_s=20, **kw):
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=timeout_s), num_workers=n, **kw)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown()


def _placed(x):
    import numpy as np
    import kolo
    kolo.init()
    total = kolo.allreduce(np.array([kolo.rank() + x], np.float64), op=kolo.Sum)
    ray_logger.log({"rank": kolo.rank(), "total": float(total[0])})
    ray_logger.log({"every": kolo.rank()}, chief_only=False)
    return (kolo.rank(), kolo.size(), kolo.local_rank(), kolo.local_size(), kolo.cross_rank(),
            kolo.cross_size(), float(total[0]), os.environ.get("KOLO_TEST_VAR"), os.environ["KOLO_JOB_ID"])


def test_results_by_rank_callbacks_and_env(executor):
    ex = executor(3)
    ex.start(extra_env_vars={"KOLO_TEST_VAR": "passed"})
    seen = []
    res = ex.run(_placed, args=(10,), callbacks=[seen.append])
    job = res[0][-1]
    assert [r[:-1] for r in res] == [(r, 3, r, 3, 0, 1, 33.0, "passed") for r in range(3)]
    assert all(r[-1] == job for r in res)
    assert {"rank": 0, "total": 33.0} in seen and all(d.get("rank", 0) == 0 for d in seen)
    assert sorted(d["every"] for d in seen if "every" in d) == [0, 1, 2]
    # kolo is still initialized in every actor: the next run is in the same job
    assert ex.run(_placed, args=(1,))[2][-1] == job


def _init_and_leave():
    import kolo
    kolo.init()
    job = os.environ["KOLO_JOB_ID"]
    kolo.shutdown()
    return job


def test_a_run_after_shutdown_starts_a_new_job(executor):
    ex = executor(2)
    ex.start()
    first = ex.run(_init_and_leave)
    second = ex.run(_init_and_leave)
    assert first[0] == first[1] and second[0] == second[1] and first[0] != second[0]
    assert ex.run(_placed, args=(0,))[1][:7] == (1, 2, 1, 2, 0, 1, 1.0)


class _Trainer:
    """An executable: built once per worker by start(), kept between execute() calls."""

    def __init__(self, scale):
        import kolo
        kolo.init()
        self.scale = scale
        self.steps = 0

    def step(self):
        import numpy as np
        import kolo
        self.steps += 1
        return float(kolo.allreduce(np.array([self.scale * self.steps], np.float64), op=kolo.Sum)[0])


def test_executable_keeps_its_state(executor):
    ex = executor(2)
    ex.start(executable_cls=_Trainer, executable_args=(3,))
    assert ex.execute(lambda t: t.step()) == [6.0, 6.0]
    assert ex.execute(lambda t: t.step()) == [12.0, 12.0]
    assert ex.execute_single(lambda t: t.steps) == 2
    refs = ex.run_remote(_placed, kwargs={"x": 5})
    assert [r[6] for r in ray.get(refs)] == [11.0, 11.0]


def test_pytorch_training_keeps_every_rank_equal(executor):
    pytest.importorskip("torch")
    ex = executor(2)
    ex.start()
    (p0, l0), (p1, l1) = ex.run(_training.train, kwargs={"steps": 30})
    for a, b in zip(p0, p1):
        assert (a == b).all()
    assert l0[-1] < l0[0] and l1[-1] < l1[0]


def _fails_on_rank_1():
    import numpy as np
    import kolo
    kolo.init()
    if kolo.rank() == 1:
        raise ValueError("rank one says no")
    kolo.allreduce(np.ones(1))  # fails at once: rank 1 left the job
    time.sleep(600)  # not reached


def test_failing_rank_is_named_and_the_others_do_not_wait(executor):
    ex = executor(3)
    ex.start()
    t0 = time.monotonic()
    with pytest.raises(KoloRayError) as ei:
        ex.run(_fails_on_rank_1)
    e = ei.value
    assert e.rank == 1, str(e)
    assert "rank 1 on" in str(e) and "ValueError: rank one says no" in str(e)
    assert "after it, rank(s) 0, 2 failed too" in str(e)
    assert any("rank one says no" in line for line in e.tail)
    assert time.monotonic() - t0 < 15  # the others' allreduce failed, nobody waited for the timeout
    # the workers are fine: the next run is a new job
    assert [r[6] for r in ex.run(_placed, args=(0,))] == [3.0, 3.0, 3.0]


def _dies_on_rank_1():
    import numpy as np
    import kolo
    kolo.init()
    if kolo.rank() == 1:
        os._exit(3)
    kolo.allreduce(np.ones(1))  # fails: rank 1 was lost


def test_dead_worker_is_named_and_the_executor_restarts(executor):
    ex = executor(2)
    ex.start()
    with pytest.raises(KoloRayError) as ei:
        ex.run(_dies_on_rank_1)
    assert ei.value.rank == 1 and "its worker process died" in str(ei.value), str(ei.value)
    with pytest.raises(KoloRayError, match=r"rank 1's worker died.*call shutdown\(\) and start\(\) again"):
        ex.run(_placed, args=(0,))
    ex.shutdown()
    ex.start()
    assert [r[6] for r in ex.run(_placed, args=(0,))] == [1.0, 1.0]
    # a worker killed between calls: the next call says which
    ray.kill(ex.workers[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # ray.kill returns before the worker is gone
        try:
            ray.get(ex.workers[1].where.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.1)
    with pytest.raises(KoloRayError, match=r"rank 1's worker \(on [\d.]+\) died before this call"):
        ex.run(_placed, args=(0,))
    ex.shutdown()


def _busy_rank_0():
    import kolo
    kolo.init()
    if kolo.rank() == 1:
        raise RuntimeError("rank 1 gives up")
    time.sleep(600)  # busy outside kolo: never learns of rank 1


def test_a_rank_busy_after_a_failure_is_stopped(executor):
    ex = executor(2, timeout_s=2)
    ex.start()
    t0 = time.monotonic()
    with pytest.raises(KoloRayError) as ei:
        ex.run(_busy_rank_0)
    assert ei.value.rank == 1 and "RuntimeError: rank 1 gives up" in str(ei.value)
    assert time.monotonic() - t0 < 30
    with pytest.raises(KoloRayError, match=r"rank\(s\) 0 were stopped, still busy 2 s after rank 1 failed"):
        ex.execute(lambda _: None)


def test_bad_arguments_are_refused(cluster):
    s = RayExecutor.create_settings()
    cases = [
        (lambda: RayExecutor(s), "say how many workers"),
        (lambda: RayExecutor(s, num_workers=2, num_hosts=1), "not both"),
        (lambda: RayExecutor(s, num_workers=0), "num_workers must be an integer of at least 1"),
        (lambda: RayExecutor(s, num_workers=2, use_gpu=True), "host memory only"),
        (lambda: RayExecutor(s, num_workers=2, min_workers=1, max_workers=3), "elastic"),
        (lambda: RayExecutor("settings", num_workers=2), "create_settings"),
        (lambda: RayExecutor.create_settings(timeout_s=0), "timeout_s must be a positive number"),
        (lambda: RayExecutor(s, num_workers=1).run(len), "not started; call start"),
        (lambda: RayExecutor(s, num_workers=1).start(extra_env_vars={"A=B": "c"}), "extra_env_vars"),
    ]
    for call, words in cases:
        with pytest.raises((ValueError, TypeError, KoloRayError)) as ei:
            call()
        assert words in str(ei.value), (words, str(ei.value))


def test_placement_the_cluster_cannot_give_is_an_error(cluster):
    ex = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=1), num_hosts=2, num_workers_per_host=1)
    t0 = time.monotonic()
    with pytest.raises(KoloRayError, match=r"could not reserve 2 host\(s\) of 1 CPU each \(STRICT_SPREAD\) within 1 s"):
        ex.start()
    assert time.monotonic() - t0 < 20
    assert ray.util.placement_group_table() == {} or all(
        p["state"] == "REMOVED" for p in ray.util.placement_group_table().values())


def test_training_example_runs_on_ray(cluster):
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "examples", "ray", "ray_synthetic_digits.py")
    p = subprocess.run([sys.executable, script, "--num-workers", "2", "--", "--epochs", "3", "--train-size", "2000",
                        "--val-size", "500", "--threads", "1", "--checkpoint-dir", ""],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert p.returncode == 0, p.stdout
    # Ray delivers actors' lines as it reads them from their log files: the last ones may still be on
    # their way when the driver exits (docs/ray.md), the first ones are there
    assert "(kolo rank 0 pid=" in p.stdout and "epoch 1/3" in p.stdout, p.stdout
    # not anchored at a line's start: Ray may write an actor's last line and its newline apart, the
    # driver's own line between them (seen in CI: "...val_acc=0.3100rank 0 on vm: 2329 img/s, ...")
    ranks = re.findall(r"rank (\d) on [^\n]*?: (\d+) img/s, val-acc ([\d.]+)$", p.stdout, re.M)
    assert [r[0] for r in ranks] == ["0", "1"], p.stdout
    assert ranks[0][2] == ranks[1][2]  # the same model on every rank, so the same accuracy
    assert float(ranks[0][2]) > 0.2, p.stdout  # above chance (0.1) after three short epochs



# ---- ElasticRayExecutor on the local cluster: every worker on the driver's node (kolorun's own
# children); the second node's, through Ray actors, in the two-node test below ----

def _elastic_loses_a_worker():
    import kolo
    steps = _training.elastic_steps(24, 2, on_commit=lambda step: ray_logger.log({"step": step, "size": kolo.size()}))
    return (kolo.rank(), kolo.size(), steps)


def test_elastic_job_goes_on_without_a_failed_worker(cluster, capfd):
    from kolo.ray import ElasticRayExecutor
    ex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3, timeout_s=20))
    ex.start()
    logged = []
    # 4 slots in the cluster, max 3: three workers, then two after rank 2's exit
    assert ex.run(_elastic_loses_a_worker, callbacks=[logged.append]) == [(0, 2, 24), (1, 2, 24)]
    assert [x["step"] for x in logged] == [4, 8, 12, 16, 20, 24], logged
    assert logged[0]["size"] == 3 and logged[-1]["size"] == 2, logged
    err = capfd.readouterr().err
    assert re.search(r"worker \d \(rank 2 of round 1\) on host \S+ exited with code 3", err), err
    assert "round 2: 2 workers (after losing worker" in err, err


def _wait_for_file(path):
    import kolo
    kolo.init()
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return kolo.rank()


def test_elastic_workers_beside_the_driver_hold_their_cpus(cluster, tmp_path):
    import threading
    from kolo.ray import ElasticRayExecutor
    ex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, timeout_s=20))
    ex.start()

    def free():
        return ray.available_resources().get("CPU", 0)

    # the earlier tests' actors and placement groups are given back asynchronously: start from
    # the whole cluster free
    before = ray.cluster_resources().get("CPU", 0)
    deadline = time.monotonic() + 30
    while free() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert free() == before, (free(), before)
    marker, out = str(tmp_path / "go"), []
    t = threading.Thread(target=lambda: out.append(ex.run(lambda: _wait_for_file(marker))))
    t.start()
    try:
        # the two workers are kolorun's children, not actors: Ray is told of them (a placement
        # group each on the driver's node), so that it gives their CPUs to no other task
        deadline = time.monotonic() + 30
        while free() != before - 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        held = free()
    finally:
        open(marker, "w").close()
        t.join(60)
    assert held == before - 2, (before, held)
    assert out == [[0, 1]], out
    deadline = time.monotonic() + 10
    while free() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert free() == before  # given back with the job's end


def _elastic_fails_everywhere():
    import kolo
    kolo.init()
    if kolo.rank() == 1:
        raise ValueError("rank one refuses")
    import time
    time.sleep(30)


def test_elastic_job_that_cannot_go_on_names_the_failure(cluster, capfd):
    from kolo.ray import ElasticRayExecutor
    ex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, timeout_s=20,
                                                               elastic_timeout=1))
    ex.start()
    t0 = time.monotonic()
    with pytest.raises(KoloRayError, match=r"the elastic job failed: .*worker \d \(rank 1\) on host \S+ exited "
                                           r"with code 1") as ei:
        ex.run(_elastic_fails_everywhere)
    assert time.monotonic() - t0 < 25, "rank 0 was not stopped"
    err = capfd.readouterr().err
    assert "ValueError: rank one refuses" in err, err  # the worker's traceback, through kolorun
    assert "fewer than --min-np 2" in err, (str(ei.value), err)


def test_elastic_bad_arguments_are_refused(cluster):
    from kolo.ray import ElasticRayExecutor
    s = ElasticRayExecutor.create_settings()
    cases = [
        (lambda: ElasticRayExecutor.create_settings(min_num_proc=0), "min_num_proc must be an integer of at least 1"),
        (lambda: ElasticRayExecutor.create_settings(min_num_proc=3, max_num_proc=2), "max_num_proc must be"),
        (lambda: ElasticRayExecutor.create_settings(elastic_timeout=-1), "elastic_timeout must be a positive"),
        (lambda: ElasticRayExecutor.create_settings(cooldown_range=(5, 1)), "cooldown_range"),
        (lambda: ElasticRayExecutor.create_settings(no_such=1), "unknown setting(s) no_such"),
        (lambda: ElasticRayExecutor(RayExecutor.create_settings()), "create_settings"),
        (lambda: ElasticRayExecutor(s, use_gpu=True), "host memory only"),
        (lambda: ElasticRayExecutor(s, cpus_per_slot=0), "cpus_per_slot must be a positive number"),
        (lambda: ElasticRayExecutor(s, env_vars={"A": 1}), "env_vars"),
        (lambda: ElasticRayExecutor(s).run(len), "not started; call start"),
    ]
    for call, words in cases:
        with pytest.raises((ValueError, TypeError, KoloRayError)) as ei:
            call()
        assert words in str(ei.value), (words, str(ei.value))
    assert ElasticRayExecutor.create_settings(min_np=2, max_np=5).max_num_proc == 5  # Horovod's older names


def test_relay_reads_kolorun_ssh_command_line_and_fails_as_ssh_does(tmp_path):
    import socket
    import subprocess
    from kolo import _relay
    argv = ["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-p", "2222", "-i", "/k", "node7", "cd /x; exec env"]
    assert _relay.parse_ssh_args(argv) == ("node7", "cd /x; exec env")
    assert _relay.parse_ssh_args(["-oX=1", "-lme", "h", "a", "b"]) == ("h", "a b")
    for bad in ([], ["-T"], ["-o", "X=1", "host"]):
        with pytest.raises(ValueError):
            _relay.parse_ssh_args(bad)
    relay = _relay.__file__
    p = subprocess.run([sys.executable, relay, "-T", "h", "true"], env={"PATH": os.environ["PATH"]},
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    assert p.returncode == 255 and "not by hand" in p.stderr, p.stderr
    # a service that is not there, then one that answers garbage: 255 and a reason, no hang
    from benchcommon import free_port
    port = free_port()
    env = {"PATH": os.environ["PATH"], "KOLO_DRIVER_SERVICE": str(port), "KOLO_DRIVER_KEY": "k"}
    p = subprocess.run([sys.executable, relay, "h", "true"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=30)
    assert p.returncode == 255 and "cannot reach the driver's service" in p.stderr, p.stderr
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    env["KOLO_DRIVER_SERVICE"] = str(srv.getsockname()[1])
    q = subprocess.Popen([sys.executable, relay, "h", "true"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    conn, _ = srv.accept()
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    conn.close()
    _, err = q.communicate(timeout=30)
    srv.close()
    assert q.returncode == 255 and "not a kolo relay frame" in err, err


def test_relay_far_end_runs_the_command_and_ends_it_when_the_connection_goes():
    import socket
    import threading
    from kolo import _relay
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(2)
    port = lst.getsockname()[1]
    code = []
    t = threading.Thread(target=lambda: code.append(_relay.serve_command(
        lst, "tok", "echo out; echo err >&2; read x; echo got $x; exit 7")))
    t.start()
    stranger = _relay.connect("127.0.0.1", port)  # a wrong token is turned away
    _relay.send_json(stranger, _relay.HELLO, {"token": "nope"})
    assert _relay.recv(stranger) == (None, b"")
    s = _relay.connect("127.0.0.1", port)
    _relay.send_json(s, _relay.HELLO, {"token": "tok"})
    _relay.send(s, _relay.STDIN, b"hi\n")
    got = {}
    while True:
        kind, body = _relay.recv(s)
        if kind == _relay.EXIT:
            break
        got[kind] = got.get(kind, b"") + body
    t.join(10)
    assert got == {_relay.STDOUT: b"out\ngot hi\n", _relay.STDERR: b"err\n"} and code == [7], (got, code)
    # the connection lost while the command runs: it is ended (SIGTERM), as sshd's hang-up would
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    port = lst.getsockname()[1]
    code = []
    t = threading.Thread(target=lambda: code.append(_relay.serve_command(lst, "tok", "sleep 60")))
    t.start()
    s = _relay.connect("127.0.0.1", port)
    _relay.send_json(s, _relay.HELLO, {"token": "tok"})
    time.sleep(0.3)
    s.close()
    t.join(10)
    assert code == [128 + 15], code


def test_elastic_example_goes_on_after_a_death_with_no_sample_lost():
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "examples", "ray", "ray_elastic_digits.py")
    p = subprocess.run([sys.executable, script, "--min-workers", "2", "--max-workers", "3", "--num-cpus", "3", "--",
                        "--epochs", "2", "--train-size", "2000", "--val-size", "500", "--threads", "1",
                        "--commit-every", "4", "--simulate-failure", "2:0:6"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert p.returncode == 0, p.stdout
    assert re.search(r"worker 2 \(rank 2 of round 1\) on host \S+ was killed by SIGKILL", p.stdout), p.stdout
    assert "[0]<stdout>:round 2: 2 workers, from epoch 1 batch 4" in p.stdout, p.stdout  # the commit before
    losses = [float(x) for x in re.findall(r"epoch \d/2 +val-loss ([\d.]+) +val-acc [\d.]+ +2 workers", p.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], p.stdout  # it learns
    # the two left, by worker id, each counted every sample of the two epochs once
    assert re.findall(r"^worker (\d) on \S+: (\d+) samples", p.stdout, re.M) == [("0", "4000"), ("1", "4000")], p.stdout
    assert "elastic job of 2 workers at its end" in p.stdout, p.stdout

# A Ray cluster of two nodes, each a host of its own: the head in network namespace "-a"
# (10.79.0.1), a second node in "-b" (10.79.0.2), the driver beside the head (_netns.py). Ray's
# token authentication is off inside them (the nodes are this test's only clients).
NS_NET = "10.79.0"
TWO_HOST_DRIVER = r"""
import json, os, sys
import ray
from kolo.ray import KoloRayError, RayExecutor
import _training
ray.cloudpickle.register_pickle_by_value(_training)

def info():
    import numpy as np, kolo
    kolo.init()
    total = kolo.allreduce(np.array([kolo.rank() + 1.0]), op=kolo.Sum)
    print("hello from rank %d" % kolo.rank(), flush=True)
    return {"rank": kolo.rank(), "total": float(total[0]), "netns": os.stat("/proc/self/ns/net").st_ino,
            "places": [kolo.local_rank(), kolo.local_size(), kolo.cross_rank(), kolo.cross_size()],
            "transports": {str(r): kolo.peer_transport(r) for r in range(kolo.size()) if r != kolo.rank()}}

def fails_on_rank_3():
    import numpy as np, kolo
    kolo.init()
    if kolo.rank() == 3:
        raise ValueError("rank three says no")
    kolo.allreduce(np.ones(1))

ray.init(address=sys.argv[1])
ex = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_hosts=2, num_workers_per_host=2)
ex.start()
out = {"results": ex.run(info)}
try:
    ex.run(fails_on_rank_3)
except KoloRayError as e:
    out["failure"] = [e.rank, e.node, str(e).split("\n")[0]]
ex.shutdown()

def elastic_loop(fail):
    # 4 workers (2 slots a node); at step 10 of round 1, rank 3 (on the second node, started
    # there through the relay and a Ray actor) calls fail(), and the job goes on with 3
    return _training.elastic_steps(20, 3, fail)

def elastic_info():
    import numpy as np, kolo
    steps = elastic_loop(lambda: os._exit(3))
    total = kolo.allreduce(np.array([kolo.rank() + 1.0]), op=kolo.Sum)
    print("elastic rank %d of %d here" % (kolo.rank(), kolo.size()), flush=True)
    return {"rank": kolo.rank(), "size": kolo.size(), "steps": steps, "total": float(total[0]),
            "netns": os.stat("/proc/self/ns/net").st_ino, "round": kolo.elastic_round(),
            "transports": {str(r): kolo.peer_transport(r) for r in range(kolo.size()) if r != kolo.rank()}}

def kill_my_actor():
    # the Ray actor that runs this worker's command on its node (the wrapper's parent) is
    # killed, as when its node goes: the worker must go with it
    import signal, time

    def parent(pid):
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    with open(VICTIM, "w") as f:
        f.write(str(os.getpid()))
    os.kill(parent(parent(os.getpid())), signal.SIGKILL)
    time.sleep(60)

def actor_dies():
    import kolo
    elastic_loop(kill_my_actor)
    return kolo.rank()

from kolo.ray import ElasticRayExecutor
VICTIM = sys.argv[2]
eex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, timeout_s=30))
eex.start()
out["driver_netns"] = os.stat("/proc/self/ns/net").st_ino
out["elastic"] = eex.run(elastic_info)
out["actor_dies"] = eex.run(actor_dies)
print("RESULTS " + json.dumps(out), flush=True)
"""


GROWING_DRIVER = r"""
import json, os, sys, time
import ray
from kolo.ray import ElasticRayExecutor

def grow():
    # a job of 2 on the head's node; when the second node joins, 2 more workers start there
    # (through Ray actors), get the state and the job goes on with 4
    import numpy as np, kolo
    import kolo.elastic as el
    kolo.init()
    state = el.ObjectState(step=0)

    @el.run
    def loop(state):
        while kolo.size() < 4 and state.step < 1200:
            kolo.allreduce(np.ones(2), name="g")
            state.step += 1
            if state.step == 2 and kolo.rank() == 0:
                open(MARK, "w").close()
            state.commit()
            time.sleep(0.05)
        return state.step

    steps = loop(state)
    return [kolo.rank(), kolo.size(), steps, os.stat("/proc/self/ns/net").st_ino]

MARK = sys.argv[2]
ray.init(address=sys.argv[1])
ex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, timeout_s=30))
ex.start()
print("RESULTS " + json.dumps({"grow": ex.run(grow), "driver_netns": os.stat("/proc/self/ns/net").st_ino}),
      flush=True)
"""


def test_two_nodes_ranks_by_host_shm_within_tcp_between(cluster, tmp_path):
    import json
    import shutil
    import signal
    import subprocess
    import tempfile
    from _netns import make_hosts
    signal.alarm(240)  # beyond the suite's per-test deadline: two Ray nodes start (5-10 s here)
    with open(tmp_path / "netns.log", "w") as log:
        ns, guard, why = make_hosts("ktray", NS_NET, log)
    if ns is None:
        pytest.skip("a Ray cluster of two hosts needs network namespaces: %s" % why)
    temp = tempfile.mkdtemp(prefix="kray")  # short: Ray's socket paths live under it
    pydir = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    here = os.path.dirname(os.path.abspath(__file__))  # the driver imports _training from here
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0",
               PYTHONPATH=os.pathsep.join([pydir, here] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = NS_NET + ".1:6379"

    def in_ns(x, *argv, timeout=90):
        return subprocess.run(["ip", "netns", "exec", ns[x]] + list(argv), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    try:
        common = ["--num-cpus", "2", "--temp-dir", temp, "--disable-usage-stats"]
        r = in_ns("a", ray_cli, "start", "--head", "--node-ip-address", NS_NET + ".1", "--port", "6379",
                  "--include-dashboard", "false", *common)
        assert r.returncode == 0, r.stdout[-3000:]
        # ElasticRayExecutor grows onto a node that joins the cluster while the job runs
        mark = tmp_path / "running"
        g = subprocess.Popen(["ip", "netns", "exec", ns["a"], sys.executable, "-c", GROWING_DRIVER, head, str(mark)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not mark.exists() and g.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        r = in_ns("b", ray_cli, "start", "--address", head, "--node-ip-address", NS_NET + ".2", *common)
        assert r.returncode == 0, r.stdout[-3000:]
        try:
            grown, _ = g.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            g.kill()
            grown, _ = g.communicate()
            pytest.fail("the growing job did not end: " + grown[-5000:])
        p = in_ns("a", sys.executable, "-c", TWO_HOST_DRIVER, head, str(tmp_path / "victim"), timeout=150)
    finally:
        guard.stdin.close()  # every Ray process of the two nodes goes with the namespaces
        guard.wait(60)
        shutil.rmtree(temp, ignore_errors=True)
    assert g.returncode == 0, grown[-5000:]
    line = [x for x in grown.splitlines() if x.startswith("RESULTS ")]
    assert line, grown[-5000:]
    out = json.loads(line[0][8:])
    # the two of the head's node (kolorun's children beside the driver), then two on the new node
    assert [r[:2] for r in out["grow"]] == [[0, 4], [1, 4], [2, 4], [3, 4]], grown[-5000:]
    assert [r[3] == out["driver_netns"] for r in out["grow"]] == [True, True, False, False], out
    assert len(set(r[2] for r in out["grow"])) == 1, out  # every rank at the same step: the state synced
    assert re.search(r"round 2: 4 workers \(.*2 new", grown), grown[-5000:]

    assert p.returncode == 0, p.stdout[-5000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULTS ")]
    assert line, p.stdout[-5000:]
    out = json.loads(line[0][8:])
    res = out["results"]
    assert [r["rank"] for r in res] == [0, 1, 2, 3] and all(r["total"] == 10.0 for r in res), res
    where = [r["netns"] for r in res]
    # ranks of a host consecutive (0 and 1 on one, 2 and 3 on the other), shared memory within a
    # host, TCP between hosts
    assert where[0] == where[1] and where[2] == where[3] and where[0] != where[2], res
    assert [r["places"] for r in res] == [[0, 2, 0, 2], [1, 2, 0, 2], [0, 2, 1, 2], [1, 2, 1, 2]], res
    for r in res:
        for peer, how in r["transports"].items():
            assert how == ("shm" if where[int(peer)] == r["netns"] else "tcp"), (r["rank"], peer, how, res)
    # the failing rank named, with the address of its node
    rank, node, first = out["failure"]
    assert rank == 3 and node in (NS_NET + ".1", NS_NET + ".2"), out["failure"]
    assert "rank 3 on" in first and "ValueError: rank three says no" in first, first
    for r in range(4):  # every rank's output reached the driver, tagged by Ray with its rank
        assert "(kolo rank %d pid=" % r in p.stdout, p.stdout[-5000:]
    # ElasticRayExecutor: the second node's workers started through Ray (kolorun's relay), rank 3
    # there lost, the job finished by the other three, ranks by host, TCP between the nodes
    el = out["elastic"]
    assert [r["rank"] for r in el] == [0, 1, 2] and all(r["size"] == 3 and r["steps"] == 20 for r in el), (
        el, p.stdout[-8000:])
    assert all(r["total"] == 6.0 and r["round"] == 2 for r in el), el
    assert out["driver_netns"] == el[0]["netns"] == el[1]["netns"] != el[2]["netns"], el
    assert el[2]["transports"] == {"0": "tcp", "1": "tcp"}, el
    assert "exited with code 3" in p.stdout and "round 2: 3 workers" in p.stdout, p.stdout[-5000:]
    assert "[2]<stdout>:elastic rank 2 of 3 here" in p.stdout, p.stdout[-5000:]
    # the actor killed: its relay exits 255 as ssh does, kolorun goes on without the worker, and
    # the worker's process is gone with its actor (the lifeline), not left running
    assert out["actor_dies"] == [0, 1, 2], p.stdout[-5000:]
    victim = int((tmp_path / "victim").read_text())
    deadline = time.monotonic() + 30  # its wrapper's watcher: SIGTERM, then SIGKILL after the grace
    while os.path.exists("/proc/%d" % victim) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists("/proc/%d" % victim), victim
    assert re.search(r"worker \d \(rank 3 of round 1\) on host %s\.2 exited with code 255" % NS_NET, p.stdout), \
        p.stdout[-5000:]


INTERRUPTED_DRIVER = r"""
import os, sys, time
import ray
from kolo.ray import RayExecutor

def sleeper(d):
    import kolo
    kolo.init()
    with open(os.path.join(d, "rank%d.pid" % kolo.rank()), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)

ray.init(address=sys.argv[2])
if sys.argv[3] == "elastic":  # kolorun and its workers must go too
    from kolo.ray import ElasticRayExecutor
    ex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2))
    ex.start()
    d = sys.argv[1]
    try:
        ex.run(lambda: sleeper(d))
    except KeyboardInterrupt:
        print("driver interrupted", flush=True)
    sys.exit(0)
ex = RayExecutor(RayExecutor.create_settings(), num_workers=2)
ex.start()
try:
    ex.run(sleeper, args=(sys.argv[1],))
except KeyboardInterrupt:
    print("driver interrupted", flush=True)
    try:
        ex.run(len, args=([],))
    except Exception as e:
        print("then: %s" % e, flush=True)
"""


@pytest.mark.parametrize("executor_kind", ["fixed", "elastic"])
def test_ctrl_c_on_the_driver_stops_every_rank(cluster, tmp_path, executor_kind):
    import signal
    import subprocess
    script = tmp_path / "driver.py"
    script.write_text(INTERRUPTED_DRIVER)
    pydir = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pydir] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # the driver joins this module's cluster, which outlives it: its ranks must go all the same
    # as from a terminal: a suite started in the background by a shell inherits SIGINT ignored,
    # and Python raises no KeyboardInterrupt for an ignored signal
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path), ray.get_runtime_context().gcs_address,
                          executor_kind],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(f.exists() for f in pids), p.stdout.read() if p.poll() is not None else "ranks never started"
    p.send_signal(signal.SIGINT)
    try:
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "driver interrupted" in out, out
    if executor_kind == "fixed":
        assert "the workers cannot be used (interrupted); call shutdown() and start() again" in out, out
    for f in pids:
        pid = int(f.read_text())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("rank pid %d outlived the interrupted run" % pid)


def test_elastic_driver_service_answers_only_the_run_secret():
    from kolo import _elastic_driver, _relay

    class NoHosts:
        def nodes(self):
            return {}

        def spawn(self, host, command):
            raise _elastic_driver.SpawnError("no host %s here" % host)

    svc = _elastic_driver.Service(NoHosts(), b"the function", None)
    try:
        def ask(hello, raw=None):
            s = _relay.connect("127.0.0.1", svc.port)
            try:
                if raw is not None:
                    s.sendall(raw)
                else:
                    _relay.send_json(s, _relay.HELLO, hello)
                return _relay.recv(s)
            except ConnectionResetError:  # closed with what it sent unread
                return (None, b"")
            finally:
                s.close()
        assert ask({"key": svc.key, "op": "fn"}) == (_relay.DATA, b"the function")
        assert ask({"key": "not the key", "op": "fn"}) == (None, b"")  # a stranger: no answer
        assert ask(None, raw=b"GET / HTTP/1.0\r\n\r\n") == (None, b"")  # garbage: closed
        kind, body = ask({"key": svc.key, "op": "nonsense"})
        assert kind == _relay.REPLY and "unknown request" in body.decode(), body
        kind, body = ask({"key": svc.key, "op": "spawn", "host": "10.0.0.9", "command": "true"})
        assert kind == _relay.REPLY and "no host 10.0.0.9 here" in body.decode(), body  # the relay says it
    finally:
        svc.close()
