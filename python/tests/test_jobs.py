"""Whole jobs started with kolorun (this file runs outside kolorun): failures never hang a job,
lost peers and stalls become HorovodInternalError, the library is found or refused clearly,
the package installs with pip, and the examples learn."""

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT

pytestmark = pytest.mark.standalone

KOLORUN = os.path.join(ROOT, "build", "bin", "kolorun")
PY = sys.executable
PYDIR = os.path.join(ROOT, "python")
# a figure in kolo-bench's table: 100000 and more print as 1.09e+05 (a 16 MiB call on a loaded
# machine took 109 ms)
NUM = r"[\d.]+(?:e\+\d+)?"


def run_job(tmp_path, np_, script, args=(), env=None, timeout=120):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    e = dict(os.environ, PYTHONPATH=PYDIR)
    e.update(env or {})
    t = time.time()
    p = subprocess.run([KOLORUN, "-np", str(np_), PY, str(path)] + list(args), env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, text=True)
    return p.returncode, p.stdout, time.time() - t


def test_a_rank_that_raises_ends_the_job(tmp_path):
    rc, out, dt = run_job(tmp_path, 2, """
        import torch, kolo.torch as hvd
        hvd.init()
        if hvd.rank() == 1:
            raise RuntimeError("rank 1 gives up")
        hvd.allreduce(torch.ones(3), name="never_matched")   # rank 0 would wait for rank 1
        print("UNREACHABLE")
    """, timeout=90)
    assert rc != 0, out
    assert "rank 1 gives up" in out and "UNREACHABLE" not in out


def test_a_lost_peer_is_an_error_on_the_survivor(tmp_path):
    rc, out, dt = run_job(tmp_path, 2, """
        import os, time, torch, kolo.torch as hvd
        hvd.init()
        hvd.allreduce(torch.ones(1), name="warmup")
        if hvd.rank() == 1:
            os._exit(0)                      # vanishes without shutdown, exit code 0
        try:
            for i in range(1000):
                hvd.allreduce(torch.ones(1000), name="step.%d" % i)
            print("NO ERROR")
        except hvd.HorovodInternalError as e:
            assert isinstance(e, RuntimeError)
            print("CAUGHT:", e)
        # the job is over for kolo: later submissions fail at once instead of waiting
        try:
            hvd.allreduce(torch.ones(1), name="after")
        except (hvd.HorovodInternalError, ValueError) as e:
            print("LATER:", type(e).__name__)
    """, timeout=90)
    assert "CAUGHT:" in out, out
    caught = out.split("CAUGHT:", 1)[1].splitlines()[0]
    assert "1" in caught  # names the lost rank
    assert "LATER:" in out


@pytest.mark.parametrize("np_,seed,transport", [(3, 3, "shm"), (4, 11, "tcp")])
def test_a_rank_that_dies_in_the_mix_is_named_by_every_survivor(np_, seed, transport):
    """kolo.torch's random mix (test_torch_ops.py) where one rank dies without a word at a point
    of a step: each survivor's pending operations all end, with the right values or naming the
    dead rank, and its pytest passes (the test there checks every operation)."""
    import mix_ref
    mix_ref.run_kill_job(KOLORUN, PY, os.path.join(ROOT, "python", "tests", "test_torch_ops.py"), np_, seed, 120,
                         dict(os.environ, PYTHONPATH=PYDIR, KOLO_TRANSPORT=transport))


def test_a_stall_becomes_an_error_with_stall_shutdown(tmp_path):
    rc, out, dt = run_job(tmp_path, 2, """
        import os, time, torch, kolo.torch as hvd
        hvd.init()
        done = os.path.join(os.environ["KOLO_TEST_DIR"], "rank0-done")
        if hvd.rank() == 0:
            try:
                hvd.allreduce(torch.ones(2), name="only_rank_0")
                print("NO ERROR")
            except hvd.HorovodInternalError as e:
                print("CAUGHT:", e)
            open(done, "w").close()
        else:
            t0 = time.monotonic()  # present, but never submits it, until rank 0 is done
            while not os.path.exists(done) and time.monotonic() - t0 < 60:
                time.sleep(0.05)
    """, env={"KOLO_STALL_CHECK_TIME": "1", "KOLO_STALL_SHUTDOWN_TIME": "2", "KOLO_TEST_DIR": str(tmp_path)},
        timeout=90)
    assert rc == 0, out
    assert "CAUGHT:" in out and "only_rank_0" in out


def test_barrier_on_a_process_set_then_on_the_world(tmp_path):
    # Unnamed requests are numbered per process set, so a barrier that only the members of a
    # set ran does not shift the world's next barrier.
    rc, out, dt = run_job(tmp_path, 2, """
        import kolo
        kolo.init()
        ps = kolo.add_process_set([1])
        if ps.included():
            kolo.barrier(process_set=ps)
        kolo.barrier()
        print("DONE")
    """, env={"KOLO_STALL_CHECK_TIME": "2", "KOLO_STALL_SHUTDOWN_TIME": "5"}, timeout=30)
    assert rc == 0, out
    assert out.count("DONE") == 2, out


def test_a_child_forked_after_init_stays_out_of_the_job(tmp_path):
    # A DataLoader's forked workers may ask their rank (seeding); a child of os.fork() that tries
    # a collective is told at once, and its exit through sys.exit (Python's atexit calls
    # shutdown()) leaves the parent's job running. Both hung before: the child's shutdown waited
    # for an engine thread it does not have, and the parent for the child.
    rc, out, dt = run_job(tmp_path, 2, """
        import os, sys, torch, kolo.torch as hvd
        hvd.init()
        class Ranks(torch.utils.data.Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return torch.tensor([float(hvd.rank()), float(hvd.size())])
        loader = torch.utils.data.DataLoader(Ranks(), batch_size=2, num_workers=2,
                                             multiprocessing_context="fork")
        for batch in loader:
            assert batch[:, 0].eq(hvd.rank()).all() and batch[:, 1].eq(2).all(), batch
        pid = os.fork()
        if pid == 0:
            hvd.init()                       # a no-op, as in the parent: code that calls it defensively
            try:
                hvd.allreduce(torch.ones(3), name="from_the_child")
                print("CHILD_RAN_A_COLLECTIVE", flush=True)
            except Exception as e:
                print("CHILD_REFUSED:", type(e).__name__, e, flush=True)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        total = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name="after_the_child")
        assert total.tolist() == [3.0, 3.0, 3.0], total
        print("PARENT_GOES_ON", hvd.rank(), flush=True)
    """, timeout=90)
    assert rc == 0, out
    assert out.count("PARENT_GOES_ON") == 2 and "CHILD_RAN_A_COLLECTIVE" not in out, out
    assert out.count("CHILD_REFUSED:") == 2, out
    assert "was forked from pid" in out and "a forked child runs no collective" in out, out


def test_a_spawned_child_that_calls_init_is_told_at_once(tmp_path):
    # multiprocessing's spawn start method re-runs the main module: an init() outside
    # `if __name__ == "__main__":` joined the job as a second copy of the rank and failed after
    # KOLO_START_TIMEOUT, blaming a firewall. Now it fails at once, naming the rank's process;
    # the parent's job goes on.
    rc, out, dt = run_job(tmp_path, 2, """
        import multiprocessing as mp, sys, time, numpy as np, kolo
        try:
            kolo.init()          # also in the spawned child, which imports this as __mp_main__
        except ValueError as e:
            if __name__ == "__main__":
                raise
            print("CHILD_SAID", e, flush=True)
            sys.exit(0)

        def work():
            pass

        if __name__ == "__main__":
            p = mp.get_context("spawn").Process(target=work)
            t = time.time()
            p.start()
            p.join()
            print("CHILD_ENDED", p.exitcode, round(time.time() - t, 1), flush=True)
            y = kolo.allreduce(np.ones(4, np.float32), op=kolo.Sum)
            print("PARENT_GOES_ON", y.tolist(), flush=True)
    """, env={"KOLO_START_TIMEOUT": "30"}, timeout=90)
    assert rc == 0, out
    assert out.count("PARENT_GOES_ON [2.0, 2.0, 2.0, 2.0]") == 2, out
    said = re.findall(r"CHILD_SAID (.*)", out)
    assert len(said) == 2, out
    for text in said:
        assert "of this job is already process" in text and "has the same rank variables" in text, out
    ended = re.findall(r"CHILD_ENDED (\S+) ([\d.]+)", out)
    assert len(ended) == 2 and all(code == "0" and float(secs) < 20 for code, secs in ended), out  # not after 30 s


def run_driver(tmp_path, script, timeout=120):
    """A plain Python process (not under kolorun) that starts its own job, as kolo.run does."""
    path = tmp_path / "driver.py"
    path.write_text(textwrap.dedent(script))
    p = subprocess.run([PY, str(path)], env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, text=True, cwd=str(tmp_path))
    return p.returncode, p.stdout


def test_kolo_run_returns_each_ranks_value(tmp_path):
    rc, out = run_driver(tmp_path, """
        import kolo, numpy as np
        offset = 10                                   # a closure's value travels with the function
        def train(x, scale=1):
            import kolo as hvd
            hvd.init()
            s = hvd.allreduce(np.array([hvd.rank() + x + offset], np.float64), op=hvd.Sum)
            return hvd.rank(), hvd.size(), float(s[0]) * scale
        print("RESULT", kolo.run(train, args=(1,), kwargs={"scale": 2}, num_proc=3))
    """)
    # ranks 0, 1, 2: sum of (r + 11) = 36, times 2
    assert rc == 0 and "RESULT [(0, 3, 72.0), (1, 3, 72.0), (2, 3, 72.0)]" in out, out


def test_kolo_run_names_the_rank_that_failed(tmp_path):
    rc, out = run_driver(tmp_path, """
        import kolo, numpy as np
        def train():
            import kolo as hvd
            hvd.init()
            if hvd.rank() == 1:
                raise ValueError("bad batch on rank 1")
            hvd.allreduce(np.ones(1), op=hvd.Sum, name="never_matched")   # the others wait for rank 1
            return "UNREACHABLE"
        try:
            kolo.run(train, num_proc=3)
        except RuntimeError as e:
            print("RAISED", e)
    """, timeout=90)
    assert rc == 0 and "UNREACHABLE" not in out, out
    said = out[out.index("RAISED"):]
    # rank 1 is the cause, not the ranks that failed because it left
    assert said.startswith("RAISED kolo.run: rank 1 failed: ValueError: bad batch on rank 1"), said
    # (the traceback shows train's source lines where the rank can read the driver's file)
    assert "its traceback:" in said and re.search(r"in train\n(?: .*\n)*ValueError: bad batch on rank 1", said), said


def test_kolo_run_without_cloudpickle_says_what_to_install(tmp_path):
    # plain pickle sends functions by name: one defined in the driver's script cannot reach the ranks
    rc, out = run_driver(tmp_path, """
        import sys
        sys.modules["cloudpickle"] = None             # as if it were not installed
        import kolo
        def train():
            return 1
        try:
            kolo.run(train, num_proc=2)
        except ValueError as e:
            print("RAISED", e)
        try:
            kolo.run(lambda: 1, num_proc=2)
        except ValueError as e:
            print("RAISED", e)
        print("RESULT", kolo.run(len, args=("abc",), num_proc=2))  # an importable function still goes
    """)
    assert rc == 0, out
    assert ("RAISED kolo.run: train cannot reach the ranks: without cloudpickle, Python's pickle sends a function by "
            "name, and the ranks cannot import one defined in the script run as __main__; install cloudpickle") in out
    assert "RAISED kolo.run: <lambda> cannot reach the ranks" in out and "defined as a lambda" in out
    assert "RESULT [3, 3]" in out


# ---- strangers on the drivers' ports (kolo.run's service, the elastic driver's, kolo.spark's output) ----

def _drivers_ports(stack):
    """Each driver's port, started in this process: (name, port, a right hello, what it answers;
    for kolo.spark's output channel, which answers nothing, the stream its lines go to)."""
    sys.path.insert(0, PYDIR)
    import io
    import kolo.spark
    from kolo import _elastic_driver, _relay, runner
    svc = runner._Service(1, b"payload", "tok", "127.0.0.1")
    stack.callback(svc.close, 1.0)

    class NoHosts:
        def nodes(self):
            return {}

    el = _elastic_driver.Service(NoHosts(), b"the function", None)
    stack.callback(el.close)
    out = io.StringIO()
    col = kolo.spark._Collector("s3cret", out, io.StringIO(), False, lambda: None)
    stack.callback(col.close)

    def frame(obj):
        body = json.dumps(obj).encode()
        return _relay.HELLO + len(body).to_bytes(4, "big") + body
    return [("kolo.run", svc.port, frame({"token": "tok", "rank": 0}), _relay.DATA + b"\0\0\0\x07payload"),
            ("elastic", el.port, frame({"key": el.key, "op": "fn"}), _relay.DATA + b"\0\0\0\x0cthe function"),
            ("spark", col.port, b"kolo.spark s3cret\n", out)]


def _served(name, port, hello, answer):
    """Asserts that a rank saying hello on a driver's port is served: its answer comes (kolo.spark:
    the line it sends after is shown)."""
    import socket
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(hello + (b"O 0 served\n" if name == "spark" else b""))
        s.settimeout(20)
        if name == "spark":
            deadline = time.monotonic() + 20
            while "served" not in answer.getvalue() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert "served" in answer.getvalue(), "spark: the line after the right hello not shown"
            return
        got = b""
        while len(got) < len(answer):
            more = s.recv(1 << 16)
            assert more, "%s: the right hello got %r" % (name, got)
            got += more
        assert got == answer, name


def _closed_within(s, seconds):
    """Whether the far end closed s (an end or a reset) within seconds."""
    import socket
    s.settimeout(seconds)
    try:
        while s.recv(1 << 16):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_drivers_ports_do_not_read_a_strangers_huge_hello():
    """A hello claiming 1 GiB was read whole into memory before the secret was compared (kolo.spark:
    a first line of any length). Now the port closes at the header (at 16 + the secret's length
    bytes of a line), and the right hello after is served."""
    import contextlib
    import socket
    with contextlib.ExitStack() as stack:
        for name, port, hello, answer in _drivers_ports(stack):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.settimeout(20)
                first = b"H" + (1 << 30).to_bytes(4, "big") if name != "spark" else b"kolo.spark "
                sent = 0
                with pytest.raises((BrokenPipeError, ConnectionResetError)):  # closed on us mid-send
                    s.sendall(first)
                    while sent < 256 << 20:
                        s.sendall(b"x" * (1 << 20))
                        sent += 1 << 20
                assert sent < 64 << 20, "%s: the port read %d MiB of a stranger's hello" % (name, sent >> 20)
            _served(name, port, hello, answer)


def test_drivers_ports_end_a_stranger_that_trickles(monkeypatch):
    """Each read of a hello had its timeout anew, so a stranger that sent a byte now and then held
    its connection (and a thread) for ever. Now the hello has HELLO_TIMEOUT in all (0.5 s here)."""
    import contextlib
    import socket
    sys.path.insert(0, PYDIR)
    from kolo import _relay
    monkeypatch.setattr(_relay, "HELLO_TIMEOUT", 0.5, raising=False)
    with contextlib.ExitStack() as stack:
        for name, port, hello, _ in _drivers_ports(stack):
            with socket.create_connection(("127.0.0.1", port)) as s:
                t0, ended = time.monotonic(), False
                for b in hello[:-1]:  # the right hello, less its last byte, 0.2 s a byte
                    try:
                        s.sendall(bytes([b]))
                    except (BrokenPipeError, ConnectionResetError):
                        ended = True
                        break
                    if _closed_within(s, 0.2):
                        ended = True
                        break
                    if time.monotonic() - t0 > 8:
                        break
                assert ended, "%s: a trickling stranger still connected after %.1f s" % (name, time.monotonic() - t0)


def test_drivers_ports_close_the_oldest_hello_past_their_bound(monkeypatch, capfd):
    """Connections in their hello had no bound: strangers connecting faster than their hellos ran
    out took a thread and a descriptor each, and all the descriptors in the end. Now at most
    HANDSHAKES_MAX (8 here) at once: one more closes the oldest from the address holding the most,
    at once (not after HELLO_TIMEOUT, an hour here), the others stay, and a rank's hello after
    them is served."""
    import contextlib
    import socket
    sys.path.insert(0, PYDIR)
    from kolo import _relay
    monkeypatch.setattr(_relay, "HANDSHAKES_MAX", 8, raising=False)
    monkeypatch.setattr(_relay, "HELLO_TIMEOUT", 3600.0)
    with contextlib.ExitStack() as stack:
        for name, port, hello, answer in _drivers_ports(stack):
            strangers = []
            for _ in range(9):
                s = socket.create_connection(("127.0.0.1", port))
                stack.callback(s.close)
                strangers.append(s)
            assert _closed_within(strangers[0], 20), "%s: the oldest of 9 silent strangers still open" % name
            for i, s in enumerate(strangers[1:], 1):
                assert not _closed_within(s, 0.05), "%s: stranger %d closed, not the oldest" % (name, i)
            _served(name, port, hello, answer)
            assert _closed_within(strangers[1], 20), "%s: the rank's connection closed no stranger" % name
    err = capfd.readouterr().err
    for name in ("kolo.run service", "the elastic job's driver", "kolo.spark output"):
        assert ("kolo: %s has 8 connections in their hello, 8 of them from 127.0.0.1: closing the oldest from "
                "there (a port scan or a flood?)\n" % name) in err, err


def test_served_commands_port_serves_its_connection_behind_silent_strangers(monkeypatch):
    """A served command's port (an elastic Spark or Ray job's worker, kolo._relay.serve_command)
    read one hello at a time: each silent stranger held it for its hello's time (an hour here),
    the right connection waiting behind, and a stream of them held it for ever. Now the hellos are
    read beside each other: the command runs at once, and the strangers' connections are ended."""
    import socket
    import threading
    sys.path.insert(0, PYDIR)
    from kolo import _relay
    monkeypatch.setattr(_relay, "HELLO_TIMEOUT", 3600.0)
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    port = lst.getsockname()[1]
    code = []
    t = threading.Thread(target=lambda: code.append(_relay.serve_command(lst, "tok", "echo out; exit 3")), daemon=True)
    t.start()
    strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        with _relay.connect("127.0.0.1", port, timeout=20) as s:
            _relay.send_json(s, _relay.HELLO, {"token": "tok"})
            s.settimeout(20)  # behind the strangers, an hour
            got = b""
            while True:
                kind, body = _relay.recv(s)
                assert kind is not None, "the connection ended before the command's exit, after %r" % got
                if kind == _relay.EXIT:
                    break
                got += body
        t.join(20)
        assert got == b"out\n" and code == [3], (got, code)
        for i, s in enumerate(strangers):
            assert _closed_within(s, 20), "stranger %d still connected after the command ran" % i
    finally:
        for s in strangers:
            s.close()


def test_drivers_port_serves_ranks_after_strangers_took_its_descriptors(tmp_path):
    """kolo.run's service in a process with a few descriptors to spare: silent strangers take them,
    accept() fails with EMFILE, and the accepting thread ended there, so the rank that connected
    next was never served. Now it accepts again as the strangers' hellos run out (1 s here), and
    the rank gets its function."""
    import socket
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent("""
        import os, resource, sys
        from kolo import _relay, runner
        _relay.HELLO_TIMEOUT = 1.0
        svc = runner._Service(1, b"payload", "tok", "127.0.0.1")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 3, hard))
        print(svc.port, flush=True)
        sys.stdin.read()
    """))
    p = subprocess.Popen([PY, str(script)], env=dict(os.environ, PYTHONPATH=PYDIR), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    strangers = []
    try:
        port = int(p.stdout.readline())
        for _ in range(12):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            strangers.append(s)
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            body = json.dumps({"token": "tok", "rank": 0}).encode()
            s.sendall(b"H" + len(body).to_bytes(4, "big") + body)
            s.settimeout(30)
            got = b""
            while len(got) < 12:
                more = s.recv(64)
                if not more:
                    break
                got += more
        assert got == b"P\0\0\0\x07payload", got
    finally:
        for s in strangers:
            s.close()
        p.stdin.close()
        p.wait(10)
    err = p.stderr.read()
    assert "kolo.run service cannot accept a connection (Too many open files); trying again" in err, err


def test_elastic_driver_says_ten_refusals_then_how_many_more(capfd):
    """A port scan wrote one line per connection; now 10 of each 10 s, then the count."""
    import socket
    sys.path.insert(0, PYDIR)
    from kolo import _elastic_driver, _relay

    class NoHosts:
        def nodes(self):
            return {}

    el = _elastic_driver.Service(NoHosts(), b"f", None)
    try:
        for _ in range(15):
            with socket.create_connection(("127.0.0.1", el.port)) as s:
                _relay.send_json(s, _relay.HELLO, {"key": "not it", "op": "fn"})
                assert _closed_within(s, 20)
        deadline = time.monotonic() + 10
        while el.refusals.said + el.refusals.more < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (el.refusals.said, el.refusals.more) == (10, 5)
        el.refusals.since -= 10  # the next window: the count is said
        el.refusals.say("one more")
    finally:
        el.close()
    err = capfd.readouterr().err
    assert err.count("turned away 127.0.0.1:") == 10, err
    assert "kolo: the elastic job's driver turned away 5 more connections in the 10 s before" in err, err


def test_kolo_run_refuses_what_it_does_not_do():
    sys.path.insert(0, PYDIR)
    import kolo
    f = lambda: 0  # noqa: E731
    for kw, why in ((dict(num_proc=0), "num_proc must be a positive integer"),
                    (dict(use_mpi=True), "kolo does not run over MPI"),
                    (dict(mpi_args="--bind-to none"), "mpirun, which kolo does not use"),
                    (dict(min_num_proc=1), "elastic jobs start with kolorun"),
                    (dict(host_discovery_script="./discover.sh"), "elastic jobs start with kolorun"),
                    (dict(hosts="a:1", hostfile="h"), "give one of them"),
                    (dict(hosts="no-such-host.invalid:2"), "no route from this machine to host")):
        with pytest.raises(ValueError, match=why):
            kolo.run(f, **kw)
    with pytest.raises(TypeError, match="fn must be callable"):
        kolo.run(3)


def test_missing_library_is_explained():
    env = dict(os.environ, PYTHONPATH=PYDIR, KOLO_LIBRARY="/nonexistent/libkolo.so")
    p = subprocess.run([PY, "-c", "import kolo"], env=env, stderr=subprocess.PIPE, text=True)
    assert p.returncode != 0
    assert "ImportError" in p.stderr and "KOLO_LIBRARY" in p.stderr and "/nonexistent/libkolo.so" in p.stderr


def test_wrong_library_version_is_refused(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "fake.c"
    src.write_text("int kolo_version(void) { return 20304; }\n")
    lib = tmp_path / "libkolo.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    env = dict(os.environ, PYTHONPATH=PYDIR, KOLO_LIBRARY=str(lib))
    p = subprocess.run([PY, "-c", "import kolo"], env=env, stderr=subprocess.PIPE, text=True)
    assert p.returncode != 0
    assert "2.3.4" in p.stderr and "0.1.0" in p.stderr and "KOLO_LIBRARY" in p.stderr


def test_pip_install(tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([PY, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", str(target), PYDIR], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0 and "No module named pip" in p.stdout:
        pytest.skip("pip is not installed for %s" % PY)
    assert p.returncode == 0, p.stdout
    shutil.rmtree(os.path.join(PYDIR, "build"), ignore_errors=True)  # setuptools' scratch tree
    for d in os.listdir(PYDIR):
        if d.endswith(".egg-info"):
            shutil.rmtree(os.path.join(PYDIR, d), ignore_errors=True)
    def packages(top):
        return sorted(os.path.relpath(d, top) for d, _, files in os.walk(os.path.join(top, "kolo"))
                      if "__init__.py" in files)
    assert packages(str(target)) == packages(PYDIR)  # pyproject.toml lists every subpackage
    env = dict(os.environ, PYTHONPATH=str(target), KOLO_LIBRARY=os.path.join(ROOT, "build", "lib", "libkolo.so"))
    code = "import kolo, kolo.torch, kolo.spark; kolo.init(); print(kolo.__file__, kolo.size())"
    p = subprocess.run([PY, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout
    assert str(target) in p.stdout and p.stdout.strip().endswith(" 1")


def test_direct_collectives_fallback(tmp_path):
    rc, out, dt = run_job(tmp_path, 2, """
        import numpy as np, torch, kolo, kolo.torch as hvd
        from kolo import _lib
        kolo.init()
        assert not _lib.HAVE_ENGINE
        n = kolo.size()
        assert kolo.allreduce(np.ones(3), op=kolo.Sum).tolist() == [n] * 3
        assert kolo.allgather(np.array([kolo.rank()])).tolist() == list(range(n))
        model = torch.nn.Linear(3, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        model(torch.ones(4, 3) * kolo.rank()).sum().backward()
        opt.step()
        print("OK")
    """, env={"KOLO_PYTHON_DIRECT": "1"})
    assert rc == 0 and out.count("OK") == 2, out


def test_direct_collectives_that_differ_name_both_calls(tmp_path):
    # Without the engine nothing negotiates: the messages carry their call (src/net/xfer.c,
    # "Call tags"). Rank 1's broadcast of rank 0's allreduce message used to succeed.
    rc, out, dt = run_job(tmp_path, 2, """
        import numpy as np, kolo
        kolo.init()
        x = np.ones(4, dtype=np.float32)
        try:
            if kolo.rank() == 0:
                kolo.allreduce(x, op=kolo.Sum)
            else:
                kolo.broadcast(x, root_rank=0)
            print("NO ERROR")
        except Exception as e:
            print("CAUGHT", type(e).__name__, e)
    """, env={"KOLO_PYTHON_DIRECT": "1"}, timeout=60)
    assert "NO ERROR" not in out, out
    assert out.count("CAUGHT") == 2, out
    assert out.count("kolo_allreduce (float32, sum)") >= 2 and out.count("kolo_broadcast (float32, root 0)") >= 2, out


@pytest.mark.parametrize("np_,env", [(4, {}), (3, {"KOLO_PYTHON_DIRECT": "1"})], ids=["4-engine", "3-direct"])
def test_adasum_suites_at_more_ranks(np_, env):
    """The multi-rank suites' Adasum tests (make test runs them at 2 and 3 ranks through the engine)
    at 4 ranks, a whole tree of pairs and a process set of 3, and at 3 through the direct
    collectives (kolo_allreduce)."""
    tests = [os.path.join(ROOT, "python", "tests", f) for f in ("test_numpy.py", "test_torch_ops.py",
                                                                 "test_torch_optimizer.py")]
    e = dict(os.environ, PYTHONPATH=PYDIR)
    e.update(env)
    p = subprocess.run([KOLORUN, "-np", str(np_), PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "adasum"]
                       + tests, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150, text=True)
    assert p.returncode == 0, p.stdout[-4000:]
    summaries = re.findall(r"(\d+) passed", p.stdout)
    assert len(summaries) == np_ and len(set(summaries)) == 1 and int(summaries[0]) > 20, p.stdout[-4000:]


def test_training_example_learns_and_checkpoints(tmp_path):
    script = os.path.join(ROOT, "examples", "pytorch", "pytorch_synthetic_digits.py")
    ck = tmp_path / "ck"
    args = [KOLORUN, "-np", "2", PY, script, "--train-size", "4000", "--val-size", "1000", "--threads", "1",
            "--checkpoint-dir", str(ck)]
    env = dict(os.environ, PYTHONPATH=PYDIR)
    p = subprocess.run(args + ["--epochs", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    epochs = re.findall(r"epoch (\d)/2 +loss ([\d.]+) .* val-acc ([\d.]+)", p.stdout)
    assert len(epochs) == 2, p.stdout  # printed by rank 0 only
    assert float(epochs[1][1]) < float(epochs[0][1])  # the loss falls
    assert float(epochs[1][2]) > 0.5  # far above chance (0.1)
    assert sorted(os.listdir(ck)) == ["checkpoint-1.pt", "checkpoint-2.pt"]
    p = subprocess.run(args + ["--epochs", "3", "--resume"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    assert "epoch 3/3" in p.stdout and "epoch 1/3" not in p.stdout


def test_training_example_learns_with_adasum(tmp_path):
    """The same script with --use-adasum: DistributedOptimizer(op=Adasum), the delta optimizer, at
    the single-worker learning rate."""
    script = os.path.join(ROOT, "examples", "pytorch", "pytorch_synthetic_digits.py")
    p = subprocess.run([KOLORUN, "-np", "2", PY, script, "--train-size", "4000", "--val-size", "1000", "--threads",
                        "1", "--epochs", "3", "--use-adasum", "--checkpoint-dir", str(tmp_path / "ck")],
                       env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    assert "lr 0.020 x 1 " in p.stdout, p.stdout
    epochs = re.findall(r"epoch (\d)/3 +loss ([\d.]+) .* val-acc ([\d.]+)", p.stdout)
    assert len(epochs) == 3, p.stdout
    assert float(epochs[2][1]) < float(epochs[0][1])  # the loss falls
    assert float(epochs[2][2]) > 0.5  # far above chance (0.1)


@pytest.mark.parametrize("extra", [["--accumulate", "2"], ["--fp16-allreduce", "--clip", "0"]],
                         ids=["clipped-accumulating", "fp16-unclipped"])
def test_transformer_example_learns_python_and_keeps_models_identical(extra):
    """examples/pytorch/pytorch_char_transformer.py, tiny: a byte-level transformer on the standard
    library's sources, with a weight used twice (embedding and output), clipping between
    synchronize() and step() or fp16 compression, 2 micro-batches per exchange or 1. The
    validation loss falls by more than a nat from a uniform guess's (ln 256 = 5.55) and the two
    workers end bit for bit equal."""
    script = os.path.join(ROOT, "examples", "pytorch", "pytorch_char_transformer.py")
    p = subprocess.run([KOLORUN, "-np", "2", PY, script, "--threads", "1", "--steps", "30", "--eval-every", "15",
                        "--layers", "1", "--dim", "32", "--heads", "2", "--context", "32", "--batch-size", "16",
                        "--corpus-mb", "0.5", "--sample", "40", "--base-lr", "0.01", "--warmup-steps", "5"] + extra,
                       env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    first = re.search(r"step 0  val-loss ([\d.]+)", p.stdout)
    last = re.search(r"step 30/30  loss [\d.]+  val-loss ([\d.]+)", p.stdout)
    assert first and last, p.stdout
    assert 5.3 < float(first.group(1)) < 5.8, p.stdout  # an untrained model guesses about uniformly
    assert float(last.group(1)) < float(first.group(1)) - 1.0, p.stdout  # 3.6-3.7 seen
    assert "models identical on all 2 workers: yes" in p.stdout, p.stdout
    assert "[0]<stdout>:def " in p.stdout and "RESULT workers=2 tokens_per_sec=" in p.stdout, p.stdout


def test_elastic_example_goes_on_after_a_death_with_no_sample_lost(tmp_path):
    """examples/pytorch/pytorch_elastic_digits.py under an elastic kolorun: worker 2 dies in the
    first epoch, the two left roll back to their last commit, finish that epoch on the samples
    not processed yet, and learn; the samples trained on add up to the epochs' exactly."""
    script = os.path.join(ROOT, "examples", "pytorch", "pytorch_elastic_digits.py")
    p = subprocess.run([KOLORUN, "-np", "3", "--min-np", "2", PY, script, "--train-size", "3000", "--val-size", "600",
                        "--threads", "1", "--epochs", "3", "--simulate-failure", "2:0:15"],
                       env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    assert "worker 2 (rank 2 of round 1) on host localhost was killed by SIGKILL" in p.stdout, p.stdout
    assert "[0]<stdout>:round 2: 2 workers, from epoch 1 batch 10" in p.stdout, p.stdout  # the commit before
    epochs = re.findall(r"epoch (\d)/3 +val-loss ([\d.]+) +val-acc ([\d.]+) +(\d) workers", p.stdout)
    assert [e[0] for e in epochs] == ["1", "2", "3"] and all(e[3] == "2" for e in epochs), p.stdout
    assert float(epochs[2][1]) < float(epochs[0][1])  # the loss falls
    result = re.search(r"RESULT workers=2 val_acc=([\d.]+) samples=(\d+)", p.stdout)
    assert result and int(result.group(2)) == 3 * 3000, p.stdout
    assert float(result.group(1)) > 0.5, p.stdout  # far above chance (0.1); 0.70 here


def horovod_unavailable():
    """Why the Horovod path cannot run here (None when it can): Horovod is not part of `make test`."""
    p = subprocess.run([PY, "-c", "import horovod.torch as h; print(h.gloo_built())"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, cwd="/")
    if p.returncode != 0:
        return "horovod.torch does not import with %s (make bench-compare builds Horovod 0.28.1): %s" % (
            PY, (p.stderr.strip().splitlines() or ["?"])[-1])
    if p.stdout.strip() != "True":
        return "Horovod is built without Gloo"
    if not shutil.which("horovodrun"):
        return "horovodrun is not on PATH"
    return None


# The same script under kolo, under Horovod (only the import differs), under DDP (--ddp, the alias
# of --framework ddp) and alone (no communication, the ceiling): each starts, trains a step and
# prints the line(s) bench/train_compare.py reads. The transformer (--model bytegpt) too, under
# kolo and DDP (whose start broadcasts the buffers: a bool mask failed it, gloo has no bool).
@pytest.mark.parametrize("framework,model", [("kolo", "resnet20"), ("horovod", "resnet20"), ("ddp", "resnet20"),
                                             ("alone", "resnet20"), ("kolo", "bytegpt"), ("ddp", "bytegpt")])
def test_synthetic_benchmark_runs(tmp_path, framework, model):
    script = os.path.join(ROOT, "examples", "pytorch", "pytorch_synthetic_benchmark.py")
    bench = [PY, script, "--model", model, "--batch-size", "4", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "1", "--num-iters", "2", "--threads", "1"]
    if framework == "horovod":
        why = horovod_unavailable()
        if why:
            pytest.skip(why)
        cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"] + bench + ["--framework", "horovod"]
    elif framework == "ddp":
        from benchcommon import free_port
        port = free_port()
        cmd = [KOLORUN, "-np", "2", "-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=%d" % port] + bench + ["--ddp"]
    else:
        cmd = [KOLORUN, "-np", "2"] + bench + ["--framework", framework]
    p = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    if framework == "alone":
        # every worker reports its own figure, and nobody adds them up
        for r in range(2):
            assert re.search(r"RESULT framework=alone workers=2 rank=%d img_per_sec=[\d.]+" % r, p.stdout), p.stdout
        assert "Total img/sec" not in p.stdout, p.stdout
        return
    assert re.search(r"Total img/sec on 2 worker\(s\): [\d.]+", p.stdout), p.stdout
    assert re.search(r"RESULT framework=%s workers=2 img_per_sec=[\d.]+" % framework, p.stdout), p.stdout


def test_step_latency_prints_what_the_harness_reads():
    # bench/peers/step_latency.py (the harness's latency-bound step) under kolorun: it checks its
    # results on every rank and prints the line compare.step_latency_check reads.
    script = os.path.join(ROOT, "bench", "peers", "step_latency.py")
    p = subprocess.run([KOLORUN, "-np", "2", PY, script, "kolo", "-t", "20", "-n", "10", "-w", "2"],
                       env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert re.search(r"step_latency kolo tensors 20 steps 10 median_us [\d.]+ p10_us [\d.]+ p90_us [\d.]+",
                     p.stdout), p.stdout


def test_idle_cpu_prints_both_phases():
    # bench/peers/idle_cpu.py (a process's CPU while the runtime idles, and while it waits for a
    # straggler) under kolorun: it checks its allreduces and prints one line; kolo's own share stays
    # far below a core in both phases (Horovod 0.28.1's: 7-9 % idle, 136-145 % waiting, by hand).
    script = os.path.join(ROOT, "bench", "peers", "idle_cpu.py")
    p = subprocess.run([KOLORUN, "-np", "2", PY, script, "kolo", "-s", "0.5"],
                       env=dict(os.environ, PYTHONPATH=PYDIR), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    m = re.search(r"idle_cpu kolo ranks 2 idle_pct ([\d.]+) waiting_pct ([\d.]+)", p.stdout)
    assert m and float(m.group(1)) < 50 and float(m.group(2)) < 50, p.stdout


def test_train_compare_adds_up_workers_alone():
    # The workers alone each print their own RESULT line; the driver sums them, and only when all
    # n are there (a worker that died must not pass for a slower machine).
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import train_compare
    alone = ["[1]<stdout>:RESULT framework=alone workers=2 rank=1 img_per_sec=26.50\n",
             "[0]<stdout>:RESULT framework=alone workers=2 rank=0 img_per_sec=27.25\n"]
    assert train_compare.result(alone, 2) == pytest.approx(53.75)
    assert train_compare.result(alone[:1], 2) is None
    assert train_compare.result(["[0]<stdout>:RESULT framework=kolo workers=2 img_per_sec=48.10\n"], 2) == 48.10
    assert train_compare.result(["no result\n"], 2) is None


def test_train_compare_writes_its_table(tmp_path):
    # The driver end to end on the smallest job: two frameworks, one worker count, one repetition.
    driver = os.path.join(ROOT, "bench", "train_compare.py")
    p = subprocess.run([PY, driver, "--reps", "1", "--workers", "2", "--frameworks", "kolo,alone",
                        "--results-dir", str(tmp_path), "--timeout", "60", "--", "--model", "resnet20",
                        "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
                        "--num-iters", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=90)
    assert p.returncode == 0, p.stdout
    (md,) = [f for f in os.listdir(tmp_path) if f.endswith("-train-compare.md")]
    text = (tmp_path / md).read_text()
    assert re.search(r"\| kolo \| [\d.]+ \|", text), text
    assert re.search(r"\| alone \(no communication: the ceiling\) \| [\d.]+ \|", text), text
    assert re.search(r"kolo with 2 workers reaches \*\*\d+ %\*\* of the same workers alone", text), text
    assert "kolorun -np N" in text and "torch " in text and "git " in text and "RAM" in text, text


def test_kolo_bench_paired_mode(tmp_path):
    # kolo-bench --vs times two sides call by call; the harness reads its rows with parse_paired.
    # Two dtypes share one set of buffers (whatever type is first), two buffer sources cannot.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compare
    bench = os.path.join(ROOT, "build", "bin", "kolo-bench")
    for first, vs, sides in ((["-d", "float32"], "float16", ("float32", "float16")),
                             (["-d", "float16"], "float32", ("float16", "float32")),
                             ([], "mem", ("float32/malloc", "float32/kolo-mem"))):
        p = subprocess.run([bench, "allreduce", "-np", "2", "-b", "4M", "-e", "16M", "-f", "4", "-n", "3", "-w", "1",
                            "-c", "1"] + first + ["--vs", vs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stdout
        assert ("same bytes, same buffers." in p.stdout) == (vs != "mem"), p.stdout
        rows = compare.parse_paired(p.stdout)
        assert [r[0] for r in rows] == [4 << 20, 16 << 20], p.stdout
        assert all(r[1] > 0 and r[2] > 0 and r[3] == 0 for r in rows), p.stdout
        assert re.search(r"^\s+16777216\s+sum\s+%s\s+%s\s+%s\s+%s\s" % (re.escape(sides[0]), NUM, NUM,
                                                                         re.escape(sides[1])), p.stdout, re.M), p.stdout
    p = subprocess.run([bench, "allreduce", "-np", "2", "--vs", "float17"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    assert p.returncode == 2 and "bad value 'float17' for --vs" in p.stdout, p.stdout


def test_benchmarks_take_huge_pages(tmp_path):
    # kolo-bench --mem thp and the MPI peers' benchmark -H 1 put their buffers in 2 MiB pages
    # (bench/bench_mem.h), say how much of them the kernel gave, and still check out; --vs mem
    # pairs them with malloc'd buffers. A kernel with THP off gives none, and they say so.
    bench = os.path.join(ROOT, "build", "bin", "kolo-bench")
    line = re.compile(r"^# buffers(?: of the thp side)? in transparent huge pages, asked for with madvise "
                      r"\(the kernel's mode: (\w+|\?)\): (\d+) MiB of rank 0's memory is in them$", re.M)
    p = subprocess.run([bench, "reducescatter", "-np", "2", "-b", "4M", "-e", "8M", "-n", "2", "-w", "1", "-c", "1",
                        "--mem", "thp"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0 and "Out of bounds values : 0 OK" in p.stdout, p.stdout
    m = line.search(p.stdout)
    assert m, p.stdout
    if m.group(1) in ("always", "madvise"):  # at least one huge page (of 2 x 10 MiB asked for: a
        assert int(m.group(2)) >= 2, p.stdout  # fragmented memory may not have free 2 MiB frames for all)
    p = subprocess.run([bench, "allgather", "-np", "2", "-b", "4M", "-e", "4M", "-n", "2", "-w", "1", "-c", "1",
                        "--mem", "thp", "--vs", "mem"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    assert p.returncode == 0 and line.search(p.stdout), p.stdout
    assert re.search(r"^\s+4194304\s+none\s+float32/thp\s+%s\s+%s\s+float32/malloc\s" % (NUM, NUM), p.stdout,
                     re.M), p.stdout
    p = subprocess.run([bench, "allreduce", "-np", "2", "--mem", "huge"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    assert p.returncode == 2 and "bad value 'huge' for --mem" in p.stdout, p.stdout
    if not shutil.which("mpicc.openmpi") or not shutil.which("mpirun.openmpi"):
        pytest.skip("Open MPI not installed (apt-get install libopenmpi-dev openmpi-bin)")
    mpi = str(tmp_path / "mpi_coll_bench")
    subprocess.run(["mpicc.openmpi", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", "-o", mpi,
                    os.path.join(ROOT, "bench", "peers", "mpi_coll_bench.c")], check=True, timeout=120)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["mpirun.openmpi", "-np", "2", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
                        "self,vader", mpi, "reducescatter", "-b", "4M", "-e", "4M", "-n", "2", "-w", "1", "-c", "1",
                        "-H", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, env=env)
    assert p.returncode == 0 and line.search(p.stdout), p.stdout
    assert re.search(r"^\s+4194304\s+\d+\s+float32\s+sum\s+-1\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+0\s", p.stdout, re.M), p.stdout


def test_compare_puts_every_peer_in_huge_pages(tmp_path):
    # bench/compare.py --mem thp gives every peer it runs buffers in huge pages (kolo-bench --mem
    # thp, mpi_coll_bench -H 1, the Python peers' -H 1), says in the results how much memory each
    # got in them, names the files -thp and leaves latest.md alone.
    import csv
    pytest.importorskip("torch")
    peers = ["kolo-shm", "torch-gloo"]
    if os.access(os.path.join(ROOT, "build", "bench", "mpi_coll_bench.openmpi"), os.X_OK):
        peers.append("ompi-shm")  # built by bench/compare.sh
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "compare.py"), "--quick", "--mem", "thp", "--peers", ",".join(peers),
                        "--colls", "allgather", "--dtypes", "float32", "--bands", "4M:4M:2:1", "--no-plots",
                        "--no-profiles", "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout
    names = os.listdir(tmp_path)
    (md,) = [f for f in names if f.endswith("-thp-quick-compare.md")]
    (cs,) = [f for f in names if f.endswith("-thp-quick-compare.csv")]
    assert "latest.md" not in names, names
    text = open(os.path.join(tmp_path, md)).read()
    assert text.splitlines()[0].endswith(", buffers in huge pages"), text
    m = re.search(r"^- \*\*Buffers in transparent huge pages\*\* .*The kernel's THP mode: ([\w?]+)\. Rank 0's memory "
                  r"in huge pages, as each launch printed it: (.*)\.$", text, re.M)
    assert m, text
    short = {"kolo-shm": "kolo shm", "torch-gloo": "torch gloo", "ompi-shm": "Open MPI shm"}
    for k in peers:
        got = re.search(r"%s (\d+)(?:-\d+)? MiB" % short[k], m.group(2))
        assert got, (k, m.group(0))
        if m.group(1) in ("always", "madvise"):  # at least one 2 MiB page of the ~12 MiB asked for
            assert int(got.group(1)) >= 2, m.group(0)
    rows = list(csv.DictReader(open(os.path.join(tmp_path, cs))))
    assert sorted(r["peer"] for r in rows) == sorted(peers), rows
    assert all(r["wrong"] == "0" and float(r["oop_time_us"]) > 0 for r in rows), rows
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "compare.py"), "--mem", "huge"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice: 'huge'" in p.stdout, p.stdout


def test_compare_pairs_launches_in_one_machine_state():
    # The harness judges kolo against a peer by pairs of launches of one repetition that both ran
    # wholly in one machine state (ping before and after each launch on one side of the split).
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compare
    st = compare.Store()

    def add(peer, rep, us, before, after):
        st.add(2, peer, {"coll": "broadcast", "dtype": "float32", "size": 1 << 20, "count": 1 << 18,
                         "place": {"oop": (us, 0)}}, (before, after), rep)
    # rep 0: both near; rep 1: kolo's launch changed state while it ran; rep 2: kolo near, the
    # peer far (a 2x gap that neither has); rep 3: both far; rep 4: the peer alone
    add("kolo-tcp", 0, 100.0, 0.05, 0.06)
    add("ompi-tcp", 0, 110.0, 0.05, 0.05)
    add("kolo-tcp", 1, 300.0, 0.05, 0.25)
    add("ompi-tcp", 1, 120.0, 0.05, 0.05)
    add("kolo-tcp", 2, 100.0, 0.05, 0.05)
    add("ompi-tcp", 2, 240.0, 0.25, 0.24)
    add("kolo-tcp", 3, 200.0, 0.25, 0.24)
    add("ompi-tcp", 3, 180.0, 0.25, 0.25)
    add("ompi-tcp", 4, 115.0, 0.05, 0.05)
    assert st.state((0.05, 0.06)) == "one" and st.state((None, None)) is None  # no split: one state
    st.split = compare.state_split([0.05] * 12 + [0.25])
    assert 0.05 < st.split < 0.25
    assert st.state((0.05, 0.25)) == "mixed" and st.state((0.25, 0.24)) == "far"
    assert st.state((0.05, None)) == "near" and st.state(0.3) == "far" and st.state((None, None)) is None
    pairs, both = st.pairs(2, "kolo-tcp", "ompi-tcp", "broadcast", "float32", 1 << 20, "oop")
    assert both == 4 and pairs == [(100.0, 110.0, "near"), (200.0, 180.0, "far")], pairs
    # the mixed launch counts in neither state's median
    assert st.med(2, "kolo-tcp", "broadcast", "float32", 1 << 20, "oop", "near") == 100.0
    assert st.count(2, "kolo-tcp", "broadcast", "float32", 1 << 20, "oop", "far") == 1
    r, used, both, _ = compare.paired_how(st, "kolo-tcp", "ompi-tcp", "broadcast", 1 << 20)
    assert (used, both) == (2, 4) and abs(r - (1.1 + 0.9) / 2) < 1e-9, r
    # with no pair in one state, the medians of both peers' launches in one state from any
    # repetitions (near: kolo's 100 and 100 against the peer's 90), not of all launches (150 and
    # 100, which would set kolo's far and mixed launches against the peer's near one)
    add("mpich-tcp", 0, 110.0, 0.25, 0.25)
    add("mpich-tcp", 3, 90.0, 0.05, 0.05)
    r, used, both, state = compare.paired_how(st, "kolo-tcp", "mpich-tcp", "broadcast", 1 << 20)
    assert (used, both, state) == (0, 2, "near") and abs(r - 90.0 / 100.0) < 1e-9, r
    # the far state where only it is shared; all launches where no state is
    add("gloo", 1, 400.0, 0.25, 0.25)
    r, used, both, state = compare.paired_how(st, "kolo-tcp", "gloo", "broadcast", 1 << 20)
    assert (r, used, both, state) == (2.0, 0, 1, "far"), (r, used, both, state)
    add("hvd", 0, 600.0, 0.05, 0.25)
    r, used, both, state = compare.paired_how(st, "kolo-tcp", "hvd", "broadcast", 1 << 20)
    assert (r, used, both, state) == (4.0, 0, 1, None), (r, used, both, state)
    assert "near state" in compare.pair_note(0, 2, "near") and "all launches" in compare.pair_note(0, 2)
    assert "1 by the medians" in compare.bare_note(3, 1) and "all launches" in compare.bare_note(2, 0)
    # a machine that stayed in one state all run: every pair counts, the mixed one too
    st.split = None
    r, used, both, _ = compare.paired_how(st, "kolo-tcp", "ompi-tcp", "broadcast", 1 << 20)
    assert (used, both) == (4, 4), (used, both)
    assert "no pair" in compare.pair_note(0, 2) and "2 of 4" in compare.pair_note(2, 4)


def test_compare_rechecks_the_uncertain_target_sizes(tmp_path, monkeypatch):
    # After the sweep the harness gives more pairs of launches to the target sizes whose verdict
    # against Open MPI is uncertain: fewer than 3 pairs in one machine state, or a paired ratio
    # within 15 % of the bar on either side; least certain first; kolo's launch first in every
    # other pair; the new pairs count in the targets.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compare
    st = compare.Store()
    M = 1 << 20

    def add(peer, coll, size, rep, us, ping=(0.05, 0.05)):
        st.add(2, peer, {"coll": coll, "dtype": "float32", "size": size, "count": size // 4,
                         "place": {"oop": (us, 0)}}, ping, rep)
    for rep in range(3):
        add("kolo-shm", "broadcast", M, rep, 100.0)         # 1.5x in 3 pairs: certain
        add("ompi-shm", "broadcast", M, rep, 150.0)
        add("kolo-shm", "broadcast", 4 * M, rep, 100.0)     # 1.05x in 3 pairs: near the bar
        add("ompi-shm", "broadcast", 4 * M, rep, 105.0)
        add("kolo-shm", "alltoall", M, rep, 100.0)          # 0.8x in 3 pairs: a clear miss
        add("ompi-shm", "alltoall", M, rep, 80.0)
        add("kolo-shm", "allreduce", 64 * M, rep, 100.0)    # 1.2x against a bar of 1.3
        add("ompi-shm", "allreduce", 64 * M, rep, 120.0)
        add("kolo-shm", "allreduce", 8, rep, 1.0)            # 0.9x against 1 / 1.5: met
        add("ompi-shm", "allreduce", 8, rep, 0.9)
        add("kolo-tcp", "broadcast", M, rep, 100.0)          # TCP: 2x, but no Open MPI TCP below
        add("ompi-tcp", "broadcast", M, rep, 200.0)
        if rep < 2:  # 0.8x in 2 pairs: their median is their mean, which one odd pair decides
            add("kolo-shm", "alltoall", 4 * M, rep, 100.0)
            add("ompi-shm", "alltoall", 4 * M, rep, 80.0)
    add("kolo-shm", "broadcast", 16 * M, 0, 100.0)           # one pair only (0.5x)
    add("ompi-shm", "broadcast", 16 * M, 0, 50.0)
    add("kolo-shm", "allgather", M, 0, 100.0, (0.25, 0.25))  # kolo far, Open MPI near: no pair
    add("ompi-shm", "allgather", M, 0, 100.0)
    st.split = compare.state_split([0.05] * 12 + [0.25])
    sizes = [8, 64 << 10, M, 4 * M, 16 * M, 64 * M]
    items = compare.recheck_items(st, sizes, compare.COLLS, {"kolo-shm", "ompi-shm", "kolo-tcp"})
    got = [(tr, coll, size) for tr, coll, size, *_ in items]
    assert got == [("shm", "allgather", M), ("shm", "alltoall", 4 * M), ("shm", "broadcast", 16 * M),
                   ("shm", "broadcast", 4 * M), ("shm", "allreduce", 64 * M)], got
    assert items[2][3:] == (1.0, (0.5, 1, 1)) and items[4][3] == 1.3, items
    assert [x[:3] for x in compare.recheck_items(st, sizes, ["alltoall"], {"kolo-shm", "ompi-shm"})] == [
        ("shm", "alltoall", 4 * M)]

    # the runner, with two made-up peers whose launches print an nccl-tests row and note their turn
    turns = tmp_path / "turns"

    class Fake(compare.Peer):
        def __init__(self, key, us):
            self.key, self.transport, self.family = key, "shm", key.split("-")[0]
            self.label = self.short = key
            self.us = us

        def launches(self, np, colls, dtypes, bands, check):
            out = []
            for c in colls:
                for b in bands:
                    row = "%12d %12d  float32  sum  -1 %8.2f 1.0 1.0 0 %8.2f 1.0 1.0 0" % (b.lo, b.lo // 4, self.us,
                                                                                            self.us)
                    code = "open(%r, 'a').write(%r); print(%r)" % (str(turns), "%s %s %d\n" % (self.key, c, b.lo), row)
                    out.append(compare.Launch([sys.executable, "-c", code], coll=c))
            return out
    monkeypatch.setattr(compare, "state_ping", lambda: 0.05)
    a = compare.parse_args(["--nranks", "2", "--colls", "broadcast,allreduce", "--dtypes", "float32",
                            "--bands", "4M:4M:5:1,64M:64M:3:1"])
    run = compare.Run()
    run.store = st
    run.pings = [(0.05, 0.05)] * 12 + [(0.25, 0.25)]
    done = compare.recheck_targets(a, [Fake("kolo-shm", 100.0), Fake("ompi-shm", 125.0)], run, str(tmp_path), 5)
    # broadcast 4 MiB reads 1.25x after its 4 pairs, clear of its bar; allreduce 64 MiB reads 1.25x
    # against 1.3, still uncertain, and gets 4 more pairs twice more (RECHECK_PASSES)
    assert [(tr, coll, size, rounds) for tr, coll, size, _, _, rounds in done] == [
        ("shm", "broadcast", 4 * M, 4), ("shm", "allreduce", 64 * M, 12)], done
    k, o = "kolo-shm broadcast %d" % (4 * M), "ompi-shm broadcast %d" % (4 * M)
    lines = turns.read_text().split("\n")
    assert lines[:8] == [k, o, o, k, k, o, o, k], lines
    # 3 pairs of the sweep at 1.05x and 4 of the recheck at 1.25x: the median of the 7
    r, used, both, _ = compare.paired_how(st, "kolo-shm", "ompi-shm", "broadcast", 4 * M)
    assert (used, both) == (7, 7) and abs(r - 1.25) < 1e-9, (r, used, both)
    rep = types_report(compare, a, st, done)
    text = "\n".join(rep.md_rechecks())
    assert "| shm | broadcast | 4 MiB | 1.00× | 1.05× (3 of 3 pairs in one state) | 1.25× (7 of 7 pairs in one state) | 4 |" \
        in text, text
    assert "| shm | allreduce | 64 MiB | 1.30× | 1.20× (3 of 3 pairs in one state) | 1.25× (15 of 15 pairs in one " \
        "state) | 12 |" in text, text
    # nothing uncertain, or no time: no rechecks
    assert compare.recheck_targets(a, [Fake("kolo-shm", 100.0)], run, str(tmp_path), 5) == []


def test_compare_tables_pair_launches_in_one_state():
    # The side-by-side tables show each peer's median over all launches, and kolo x as the targets
    # judge: pairs of launches in one machine state. Here kolo's median (200 us, two far launches)
    # against Open MPI's (100, two near) reads 0.5x, while the pairs in one state read 1.5x (far)
    # and 1.11x (near).
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import types
    import compare
    st = compare.Store()
    M = 1 << 20
    for peer, rep, us, ping in (("kolo-tcp", 0, 200.0, 0.25), ("ompi-tcp", 0, 100.0, 0.05),
                                ("kolo-tcp", 1, 200.0, 0.25), ("ompi-tcp", 1, 300.0, 0.25),
                                ("kolo-tcp", 2, 90.0, 0.05), ("ompi-tcp", 2, 100.0, 0.05),
                                ("ompi-tcp", 3, 100.0, 0.05)):
        st.add(2, peer, {"coll": "broadcast", "dtype": "float32", "size": M, "count": M // 4,
                         "place": {"oop": (us, 0)}}, (ping, ping), rep)
    st.split = compare.state_split([0.05] * 12 + [0.25])
    peers = [types.SimpleNamespace(key=k, transport="tcp", family=k.split("-")[0], short=k) for k in ("kolo-tcp", "ompi-tcp")]
    rep = types.SimpleNamespace(args=types.SimpleNamespace(coll_list=["broadcast"], dtype_list=["float32"], np_list=[2]),
                                peers=peers, status={"kolo-tcp": (True, ""), "ompi-tcp": (True, "")},
                                kolo={"tcp": "kolo-tcp"}, sizes=[M], store=st, lim={})
    text = "\n".join(compare.Report.md_tables(rep))
    bw = lambda us: "%.2f GB/s" % (M / 1e3 / us)
    row = "| 1 MiB | %s | %s | **1.31×** |" % (bw(200.0), bw(100.0))
    assert row in text, text


def types_report(compare, a, store, rechecks):
    """A Report with just what md_rechecks reads."""
    import types
    rep = types.SimpleNamespace(args=a, store=store, rechecks=rechecks)
    return types.SimpleNamespace(md_rechecks=lambda: compare.Report.md_rechecks(rep))


def test_compare_counts_the_sizes_at_other_rank_counts():
    # At rank counts other than 2 (the targets'), a row without a target counts the sizes from 64 KiB
    # at which kolo is at least as fast as Open MPI, per collective, naming the sizes behind. Each
    # size's ratio pairs launches in one machine state, as the targets' do.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import types
    import compare
    st = compare.Store()
    sizes = [32 << 10, 64 << 10, 1 << 20, 4 << 20]

    def add(peer, coll, size, us, rep):
        st.add(4, peer, {"coll": coll, "dtype": "float32", "size": size, "count": size // 4,
                         "place": {"oop": (us, 0)}}, None, rep)
    for rep in (0, 1, 2):
        for size in sizes:
            add("kolo-shm", "alltoall", size, 100.0 + rep, rep)
            add("ompi-shm", "alltoall", size, {1 << 20: 50.0, 4 << 20: 90.0}.get(size, 200.0) + rep, rep)
            add("kolo-shm", "allgather", size, 100.0, rep)
            add("ompi-shm", "allgather", size, 100.0, rep)
    add("kolo-tcp", "alltoall", 64 << 10, 100.0, 0)  # no Open MPI TCP figure: no row
    # broadcast: kolo's launches far (slow) and Open MPI's near in two repetitions, both near in
    # the third: by the medians over all launches kolo reads 0.55x, by its one pair 1.10x
    for rep_, (k_us, k_ping, o_us, o_ping) in enumerate([(200.0, 0.25, 110.0, 0.05)] * 2 + [(100.0, 0.05, 110.0, 0.05)]):
        for peer, us, ping in (("kolo-shm", k_us, k_ping), ("ompi-shm", o_us, o_ping)):
            st.add(4, peer, {"coll": "broadcast", "dtype": "float32", "size": 64 << 10, "count": 16 << 10,
                             "place": {"oop": (us, 0)}}, (ping, ping), rep_)
    st.split = compare.state_split([0.05] * 8 + [0.25] * 4)
    rep = types.SimpleNamespace(store=st, sizes=sizes, kolo={"shm": "kolo-shm", "tcp": "kolo-tcp"},
                                args=types.SimpleNamespace(coll_list=["allgather", "alltoall", "broadcast"]))
    rep.paired_speedups = lambda *a, **k: compare.Report.paired_speedups(rep, *a, **k)
    rows = compare.Report.md_counts(rep, 4)
    assert len(rows) == 1, rows
    assert "4 ranks: kolo ≥ Open MPI shared memory" in rows[0] and "3 repetitions" in rows[0], rows
    # the allgathers and alltoalls carry no pings: by the medians, and the row says how many
    assert "(6 of 7 sizes without one: by the medians)" in rows[0], rows
    # a tie counts as met; the sizes behind, worst first; 32 KiB is below the range
    assert "| allgather 3 of 3; alltoall 1 of 3 (1 MiB 0.50×, 4 MiB 0.90×); broadcast 1 of 1 | — |" in rows[0], rows
    assert compare.Report.md_counts(rep, 8) == []


def test_kolo_bench_prints_every_call():
    # --calls 1: after each size's row, one '# calls' line per placement with every timed call's time
    # (the slowest rank's); the row's own figures are unchanged in kind. With --vs it is refused.
    bench = os.path.join(ROOT, "build", "bin", "kolo-bench")
    p = subprocess.run([bench, "allgather", "-np", "3", "-b", "3K", "-e", "12K", "-n", "4", "-w", "1", "-c", "1",
                        "--calls", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    sizes = re.findall(r"^\s+(\d+)\s+\d+\s+float32", p.stdout, re.M)
    assert sizes == ["3072", "6144", "12288"], p.stdout
    calls = re.findall(r"^# calls (\d+) (out-of-place|in-place):((?: [\d.]+)*)$", p.stdout, re.M)
    assert [(c[0], c[1]) for c in calls] == [(s, w) for s in sizes for w in ("out-of-place", "in-place")], p.stdout
    assert all(len(c[2].split()) == 4 and all(float(x) > 0 for x in c[2].split()) for c in calls), p.stdout
    lines = p.stdout.splitlines()
    for s in sizes:  # each size's two lines follow its row
        row = next(i for i, l in enumerate(lines) if re.match(r"\s+%s\s" % s, l))
        assert lines[row + 1].startswith("# calls %s out-of-place:" % s), p.stdout
        assert lines[row + 2].startswith("# calls %s in-place:" % s), p.stdout
    p = subprocess.run([bench, "allreduce", "-np", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0 and "# calls" not in p.stdout, p.stdout
    for args, msg in ((["--calls", "2"], "bad value '2' for --calls"), (["--calls", "1", "--vs", "float16"], "--calls is for the sweep")):
        p = subprocess.run([bench, "allreduce", "-np", "2"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30)
        assert p.returncode == 2 and msg in p.stdout, (args, p.stdout)


def test_kolo_bench_warms_for_a_time():
    # -W: the ranks keep calling at the first size until one has spent W ms, and agree to stop; the
    # sweep after it is the usual one, checked. A time the ranks cannot agree on is refused.
    bench = os.path.join(ROOT, "build", "bin", "kolo-bench")
    t0 = time.monotonic()
    p = subprocess.run([bench, "alltoall", "-np", "3", "-b", "1K", "-e", "4K", "-n", "3", "-w", "1", "-c", "1",
                        "-W", "300"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout
    assert re.findall(r"^\s+(\d+)\s+\d+\s+float32", p.stdout, re.M) == ["1020", "2040", "4092"], p.stdout
    assert "Out of bounds values : 0 OK" in p.stdout, p.stdout
    assert took >= 0.3, took
    for bad in ("-1", "x", "70000"):
        p = subprocess.run([bench, "alltoall", "-np", "2", "-W", bad], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        assert p.returncode == 2 and "-W" in p.stdout, (bad, p.stdout)


def test_engine_bench_times_blocks_under_one_timeline(tmp_path):
    # engine-bench -t -T K: blocks of K steps under one timeline, paired with blocks without; the
    # timeline of the last block holds K steps of every tensor, and the harness reads the line.
    bench = os.path.join(ROOT, "build", "bin", "engine-bench")
    tl = str(tmp_path / "tl.json")
    p = subprocess.run([bench, "-np", "2", "-n", "2", "-w", "0", "-s", "5", "-T", "3", "-t", tl],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    m = re.search(r"timeline on\s+median\s+([0-9.]+) ms; paired on / off median ([0-9.]+) over 2 pairs of blocks",
                  p.stdout)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, p.stdout
    assert "3 steps per timeline" in p.stdout, p.stdout
    for path in (tl, tl + ".1"):
        with open(path) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        begins = collections.Counter(rows.get(e["tid"]) for e in events if e["ph"] == "B" and e["name"] == "ALLREDUCE")
        assert len(begins) == 161 and set(begins.values()) == {3}, (path, begins)
    for bad in ("0", "x", "1001"):
        p = subprocess.run([bench, "-T", bad, "-t", tl], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30)
        assert p.returncode == 2, (bad, p.stdout)


def test_engine_bench_times_steps_beside_and_on_process_sets():
    # engine-bench -p 1: short steps on the world, beside two idle process sets, on the set
    # without rank 0 and on a set of every rank (3 ranks or more; fewer exit 2 saying so)
    bench = os.path.join(ROOT, "build", "bin", "engine-bench")
    p = subprocess.run([bench, "-np", "3", "-n", "1", "-w", "0", "-s", "20", "-p", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    for line in (r"short step \(8 x 256 floats\), world", r"short step beside 2 idle process sets",
                 r"short step on set \{1\.\.2\}, rank 0 idle", r"short step on a set of every rank"):
        m = re.search(line + r"\s+([0-9.]+) us per step", p.stdout)
        assert m and float(m.group(1)) > 0, (line, p.stdout)
    p = subprocess.run([bench, "-np", "2", "-p", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=30)
    assert p.returncode == 2 and "needs 3 ranks" in p.stdout, p.stdout


def test_wait_bench_measures_the_waiting_ranks():
    # wait-bench: rank 0 late to a barrier (or, -e, to an engine allreduce); one line per round
    # with the waiting ranks' CPU and their liveness checks (the barrier's own thread checks; the
    # engine's waits are on its thread, so 0 there); bad arguments exit 2 naming what is wrong.
    bench = os.path.join(ROOT, "build", "bin", "wait-bench")
    line = r"round (\d): the 2 waiting ranks used ([0-9.]+) CPU s in 0.30 s: ([0-9.]+) % of a core each; (\d+) liveness"
    for mode in ([], ["-e"]):
        p = subprocess.run([bench, "-np", "3", "-s", "0.3", "-r", "2"] + mode, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        assert p.returncode == 0, p.stdout
        rounds = re.findall(line, p.stdout)
        assert [r[0] for r in rounds] == ["0", "1"], p.stdout
        assert ("through the engine" in p.stdout) == bool(mode), p.stdout
        for _, cpu, share, checks in rounds:
            assert float(cpu) >= 0 and float(share) < 100, p.stdout
            assert (int(checks) == 0) if mode else (0 < int(checks) <= 100), p.stdout
    for bad, says in ((["-np", "1"], "needs 2 or more ranks"), (["-s", "0"], "-s must be above 0"),
                      (["-x"], "usage: wait-bench")):
        p = subprocess.run([bench] + bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        assert p.returncode == 2 and says in p.stdout, (bad, p.stdout)


def _bench_module(name):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import importlib
    return importlib.import_module(name)


def test_profile_sorts_symbols_and_says_what_differs():
    # bench/profile.py on perf's own report format, without perf: categories, per-call CPU, diagnosis.
    prof = _bench_module("profile")
    text = """# comment
 40.00% ; 400 ;kolo-bench ;libc.so.6 ;[.] __memmove_avx512_unaligned_erms
 20.00% ; 200 ;kolo-bench ;kolo-bench ;[.] sum_f32_avx512
 10.00% ; 100 ;kolo-bench ;kolo-bench ;[.] kolo__wait
 10.00% ; 100 ;kolo-bench ;[kernel.kallsyms] ;[k] follow_page_pte
 10.00% ; 100 ;kolo-bench ;[kernel.kallsyms] ;[k] tcp_sendmsg_locked
  5.00% ; 50 ;kolo-bench ;kolo-bench ;[.] tcp_send_frames
  5.00% ; 50 ;kolo-timeline ;kolo-bench ;[.] fill
  0.10% ; 1 ;kolo-bench ;[kernel.kallsyms] ;[k] check_stack_object
  0.10% ; 1 ;kolo-bench ;[kernel.kallsyms] ;[k] check_vma_flags
  0.10% ; 1 ;kolo-bench ;kolo-bench ;[.] check_dtype_op
"""
    rows = prof.parse_report(text)
    assert len(rows) == 10 and rows[0] == (400, "kolo-bench", "libc.so.6", "__memmove_avx512_unaligned_erms")
    cats = [prof.categorize(sym, dso) for _, _, dso, sym in rows]
    # The kernel's usercopy and pinning checks are not the benchmark's check loop, nor is the
    # library's argument check linked into kolo-bench.
    assert cats == ["copy", "reduce", "wait", "pin", "net", "other", "bench", "copy", "pin", "other"], cats
    s = prof.summarize(rows, calls=10)
    ms = prof.PERIOD_NS / 1e6 / 10
    assert s["cats"]["copy"] == pytest.approx(401 * ms) and s["cpu_ms"] == pytest.approx(1003 * ms)
    assert s["threads"]["kolo-timeline"] == pytest.approx(50 * ms) and s["top"][0][1].startswith("__memmove")
    peer = dict(s, cats=dict(s["cats"], copy=s["cats"]["copy"] / 4, pin=0.0), cpu_ms=s["cpu_ms"] / 2)
    shows, close = prof.diagnose(s, peer, "shm", "Open MPI", wall_k=2.0, wall_p=1.0)
    assert "copying (+" in " ".join(shows) and any("CMA" in c for c in close), (shows, close)
    shows, close = prof.diagnose(s, peer, "shm", "Open MPI", wall_k=1.0, wall_p=1.0)
    assert "did not reproduce" in shows[0] and not close, shows
    shows, close = prof.diagnose(s, None, "shm", wall_k=5.0, bound_ms=1.0)
    assert "machine's rate" in " ".join(close) and "waiting" in " ".join(shows), (shows, close)
    assert "no faster" in " ".join(close), close  # what was measured of that remedy at 2 ranks
    shows, close = prof.diagnose(s, None, "shm", wall_k=5.0, bound_ms=1.0, nranks=4)
    assert "machine's rate" in " ".join(close) and "no faster" not in " ".join(close), close


def test_profiles_compare_out_of_place_as_the_sweep_does():
    # A profiled launch's time per call is the out-of-place figure where the row has one (the
    # sweep's ratios are out-of-place), not a mean with an in-place call that takes another path.
    compare = _bench_module("compare")
    text = ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
            "     4194304      1048576  float32   none     -1   240.00   17.48    8.74    N/A"
            "  1270.00    3.30    1.65    N/A\n")
    (row,), _ = compare.parse_rows(text, "alltoall")
    assert set(row["place"]) == {"oop", "ip"} and compare.sweep_us(row) == pytest.approx(240.0)
    ip_only = "     8  2  float32  sum  -1  N/A  N/A  N/A  N/A  12.50  0.00  0.00  0\n"
    (row,), _ = compare.parse_rows(ip_only, "allreduce")
    assert set(row["place"]) == {"ip"} and compare.sweep_us(row) == pytest.approx(12.5)


def test_profile_samples_only_the_timed_calls(tmp_path):
    # A real kolo-bench launch under perf: rank 0 turns sampling on for the timed calls only
    # (bench/perf_ctl.h), so the fill and check loops of the benchmark take no samples.
    prof = _bench_module("profile")
    ok, why = prof.available()
    if not ok:
        pytest.skip(why)
    bench = os.path.join(ROOT, "build", "bin", "kolo-bench")

    def run(cmd, env):
        p = subprocess.run(cmd, env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        return p.stdout, p.returncode, False
    s, text = prof.profile([bench, "allreduce", "-np", "2", "-b", "4M", "-e", "4M", "-n", "40", "-w", "3", "-c", "1"],
                           {}, lambda out: 80 if "4194304" in out else 0, run, str(tmp_path), "t")
    assert "why" not in s, (s, text)
    assert s["calls"] == 80 and s["cpu_ms"] > 0, s
    assert s["cats"]["bench"] == 0, s["by_cat"]["bench"]  # fill and check ran with sampling off
    assert s["cats"]["copy"] + s["cats"]["reduce"] > 0.3 * s["cpu_ms"], s
    assert not [f for f in os.listdir(tmp_path)], os.listdir(tmp_path)  # data and fifos removed


KOLO_TIMELINE_TOOL = os.path.join(ROOT, "build", "bin", "kolo-timeline")


def test_timeline_tool_names_the_rank_the_others_waited_for(tmp_path):
    tl = tmp_path / "tl.json"
    rc, out, dt = run_job(tmp_path, 3, """
        import time, torch, kolo.torch as hvd
        hvd.init()
        for step in range(15):
            if hvd.rank() == 1:
                time.sleep(0.03)             # rank 1 does more before each step's collectives
            hs = [hvd.allreduce_async_(torch.ones(1000 * (i + 1)), name="grad.%d" % i) for i in range(3)]
            for h in hs:
                hvd.synchronize(h)
        hvd.shutdown()
    """, env={"KOLO_TIMELINE": str(tl)})
    assert rc == 0, out
    p = subprocess.run([KOLO_TIMELINE_TOOL, "--json", str(tl), str(tl) + ".1"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    s = json.loads(p.stdout)
    v = s["verdict"]
    assert v is not None and v["rank"] == 1, p.stdout
    assert v["last"] >= 12 and v["median_wait_us"] > 15000, p.stdout  # it slept 30 ms before each of 15 steps
    assert [f["rank"] for f in s["files"]] == [0, 1]
    phases = {x["phase"]: x["share"] for x in s["files"][0]["phases"]}
    assert phases["negotiation (waiting for every rank's report)"] > 0.5, phases
    assert {t["tensor"] for t in s["files"][0]["top_tensors"]} == {"allreduce.grad.%d" % i for i in range(3)}
    # the text says it in words; a file cut in the middle of a line (a copy taken while it was
    # written) is read up to its last whole event
    data = tl.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[:data.rfind(b"\n", 0, len(data) * 2 // 3) + 20])
    p = subprocess.run([KOLO_TIMELINE_TOOL, str(cut)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout
    assert re.search(r"^rank 1 reported last in \d+ of \d+ negotiations, [\d.]+ ms after the first rank", p.stdout,
                     re.M), p.stdout
    # --merge: one timeline of both ranks, valid JSON, every event of both files, rank 1's shifted
    merged = tmp_path / "all.json"
    p = subprocess.run([KOLO_TIMELINE_TOOL, "--merge", str(merged), str(tl), str(tl) + ".1"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    evs = json.loads(merged.read_text())
    files = [json.loads(tl.read_text()), json.loads((tmp_path / "tl.json.1").read_text())]
    assert len(evs) == len(files[0]) + len(files[1]) and "%d events of 2 file(s)" % len(evs) in p.stdout
    assert sorted({e["pid"] for e in evs}) == [0, 1]
    starts = [f[0]["args"]["start_time_since_epoch_in_micros"] for f in files]
    first1 = next(e["ts"] for e in files[1] if "ts" in e)
    got1 = next(e["ts"] for e in evs if e["pid"] == 1 and "ts" in e)
    assert got1 == pytest.approx(first1 + (starts[1] - min(starts)), abs=0.002), (got1, first1, starts)
    p = subprocess.run([KOLO_TIMELINE_TOOL, "--merge", str(tl), str(tl)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 1 and "would overwrite one of the files read" in p.stdout, p.stdout
    # what is not a timeline is said to be so
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a timeline"}\n')
    p = subprocess.run([KOLO_TIMELINE_TOOL, str(bad), str(tmp_path / "missing.json")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 1 and "not a kolo timeline" in p.stdout, p.stdout
    horovods = tmp_path / "horovod.json"  # Horovod's own layout: events end with commas, several a line
    horovods.write_text('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {}},\n'
                        '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 9345, "pid": 1},{"ph": "E", "ts": 9, "pid": 1},\n')
    p = subprocess.run([KOLO_TIMELINE_TOOL, str(horovods)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert p.returncode == 1 and "line 2 is not one event: a Horovod timeline?" in p.stdout, p.stdout


KOLO_HANG_TOOL = os.path.join(ROOT, "build", "bin", "kolo-hang")


def kolo_hang(log, *args):
    p = subprocess.run([PY, KOLO_HANG_TOOL] + list(args) + ["-"], input=log, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    return p.returncode, p.stdout


@pytest.mark.parametrize("how", ["direct", "engine", "status"])
def test_kolo_hang_names_the_rank_a_job_waits_on(tmp_path, how):
    # Rank 2 comes 2 s late to an allreduce, which ranks 0 and 1 wait in: what their logs say
    # (the direct path's stall warning, the engine's stall inspector, or the status lines a
    # monitoring thread prints) names rank 2 to kolo-hang, which reads no kolorun state.
    rc, out, dt = run_job(tmp_path, 3, """
        import json, os, threading, time, numpy as np, kolo
        kolo.init()
        if os.environ.get("HOW") == "status" and kolo.rank() < 2:
            def report():
                time.sleep(0.8)
                print("[kolo %d status] %s" % (kolo.rank(), json.dumps(kolo.status())), flush=True)
            threading.Thread(target=report).start()
        if kolo.rank() == 2:
            time.sleep(2)
        kolo.allreduce(np.ones(1000, dtype=np.float32), name="grad.7")
        print("DONE")
    """, env={"HOW": how, "KOLO_STALL_CHECK_TIME": "0.5" if how != "status" else "600",
              "KOLO_PYTHON_DIRECT": "1" if how != "engine" else "0"}, timeout=60)
    assert rc == 0 and out.count("DONE") == 3, out
    code, said = kolo_hang(out)
    assert code == 0, said + out
    assert said.splitlines()[-1].startswith("the job waits for rank 2"), said + out
    why = 'to submit "allreduce.grad.7"' if how == "engine" else "in kolo_allreduce"
    for r in (0, 1):
        assert "rank %d waits for rank 2 (%s" % (r, why) in said, said + out


@pytest.mark.parametrize("how", ["roots", "sets"])
def test_kolo_hang_names_what_ranks_that_wait_on_each_other_differ_in(tmp_path, how):
    # Ranks that wait on each other where no message crosses for the call tags to catch: a
    # broadcast whose two ranks each name the other the root, and three ranks on three process
    # sets of two, each waiting for the next. Each waits past KOLO_STALL_CHECK_TIME (its warning
    # numbers the call on its set), KOLO_OP_TIMEOUT then ends the job; kolo-hang sets the waiting
    # ranks' calls side by side.
    rc, out, dt = run_job(tmp_path, 2 if how == "roots" else 3, """
        import os, numpy as np, kolo
        kolo.init()
        x = np.ones(4, dtype=np.float32)
        kolo.allreduce(x, name="warmup")
        if os.environ["HOW"] == "roots":
            kolo.broadcast(x, root_rank=1 - kolo.rank())
        else:
            sets = [kolo.add_process_set([0, 1]), kolo.add_process_set([1, 2]), kolo.add_process_set([0, 2])]
            kolo.allreduce(x, process_set=sets[kolo.rank()])
        print("UNREACHABLE")
    """, env={"HOW": how, "KOLO_STALL_CHECK_TIME": "0.5", "KOLO_OP_TIMEOUT": "3", "KOLO_PYTHON_DIRECT": "1"},
        timeout=60)
    assert rc != 0 and "UNREACHABLE" not in out, out
    code, said = kolo_hang(out)
    assert code == 0, said + out
    if how == "roots":
        # from its warning, or from its KOLO_OP_TIMEOUT error where it timed out first
        assert re.search(r"^rank 0 waits for rank 1 \((in|until KOLO_OP_TIMEOUT failed its) kolo_broadcast \(float32, "
                         r"root 1\)", said, re.M), said
        assert said.splitlines()[-1] == ("rank 0 called kolo_broadcast (float32, root 1) where rank 1 called "
                                         "kolo_broadcast (float32, root 0), both call 2 on process set 0: the ranks "
                                         "passed different roots"), said + out
    else:
        assert said.splitlines()[-1] == (
            "rank 0 waits in kolo_allreduce (float32, average) on process set 1 for rank 1, which is in kolo_allreduce "
            "(float32, average) on process set 2: the ranks called collectives on different process sets, or in "
            "different orders"), said + out


def test_kolo_hang_reads_any_launchers_lines():
    # srun -l's prefix, a rank list with ranges, an engine's stopped peer, a newer report that
    # replaces an older one, and ranks that all wait on one another
    log = "\n".join([
        "0: [kolo 0 warning] kolo_barrier on process set 0 has waited 61 s for rank(s) 5 without progress: ...",
        "0: [kolo 0 warning] kolo_allreduce on process set 0 has waited 60 s for rank(s) 1, 3-4 without progress: ...",
        "2: [kolo 2 warning] the engine has waited 60 s for rank(s) 4 without progress, negotiating on ...",
        "3: [kolo 3 status] " + json.dumps({"rank": 3, "direct": None, "engine": {"waiting_for": None}}),
        "garbage [kolo 7 status] {not json",
        "[kolo 6 error] rank 6 waited 300 s for rank(s) 4 without progress (KOLO_OP_TIMEOUT) in kolo_allreduce "
        "(float32, sum): the peer is alive ...",
        "[kolo 8 error] rank 6 on h aborted the job because: rank 6 waited 300 s for rank(s) 4 without progress ...",
    ]) + "\n"
    code, said = kolo_hang(log)
    assert code == 0, said
    assert "rank 0 waits for ranks 1, 3, 4 (in kolo_allreduce on process set 0)" in said, said
    assert "rank 2 waits for rank 4 (in the engine's exchange)" in said, said
    assert "rank 6 waits for rank 4 (until KOLO_OP_TIMEOUT failed its kolo_allreduce (float32, sum))" in said, said
    assert "rank 8" not in said, said
    assert "the job waits for rank 1, which said nothing" in said, said
    assert "the job waits for rank 3: it waits for no rank in kolo" in said, said
    assert "the job waits for rank 4, which said nothing" in said and "rank 5" not in said, said
    code, said = kolo_hang("[1]<stderr>:[kolo 0 warning] kolo_allreduce on process set 0 has waited 60 s for rank(s) 1 "
                           "without progress\n[0]<stderr>:[kolo 1 warning] kolo_allreduce on process set 0 has waited "
                           "60 s for rank(s) 0 without progress\n")
    assert code == 1 and "every waiting rank waits for another" in said, said
    # numbered calls: one rank a call ahead of the other, from a warning and a status line
    code, said = kolo_hang("[kolo 0 warning] kolo_allreduce (float32, sum) of 4 elements, call 7 on process set 0, "
                           "has waited 60 s for rank(s) 1 without progress\n[kolo 1 status] " + json.dumps(
                               {"rank": 1, "direct": {"call": "kolo_barrier", "process_set": 0, "number": 8,
                                                      "count": 0, "what": "kolo_barrier",
                                                      "waiting_for": {"ranks": [0]}}}) + "\n", "--json")
    assert code == 0, said
    assert json.loads(said)["cause"] == ("rank 0 is in its call 7 on process set 0 (kolo_allreduce (float32, sum)) "
                                         "and rank 1 in its call 8 (kolo_barrier): one rank made direct collectives "
                                         "the other did not"), said
    code, said = kolo_hang("nothing here\n", "--json")
    assert code == 1 and json.loads(said) == {"waits": {}, "culprits": [], "cause": None}, said
