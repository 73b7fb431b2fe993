"""The job's shape, build probes, ops, process sets, re-init, timeline (multi-rank)."""

import json
import os

import numpy as np
import pytest

import kolo


def test_shape_of_the_job():
    assert kolo.is_initialized()
    n, r = kolo.size(), kolo.rank()
    assert n == int(os.environ["KOLO_SIZE"]) and r == int(os.environ["KOLO_RANK"])
    assert 0 <= kolo.local_rank() < kolo.local_size() <= n
    assert 0 <= kolo.cross_rank() < kolo.cross_size()
    assert kolo.local_size() * kolo.cross_size() == n  # one host, or equal hosts
    assert kolo.is_homogeneous()
    ranks = kolo.allgather(np.array([r], np.int32))
    assert ranks.tolist() == list(range(n))
    assert kolo.peer_transport(r) == "self"


def test_init_twice_is_harmless():
    kolo.init()
    assert kolo.is_initialized() and kolo.size() == int(os.environ["KOLO_SIZE"])


def test_build_probes_are_truthful():
    for f in (kolo.mpi_built, kolo.mpi_enabled, kolo.gloo_built, kolo.gloo_enabled, kolo.nccl_built,
              kolo.ccl_built, kolo.cuda_built, kolo.rocm_built, kolo.ddl_built, kolo.sycl_built):
        assert f() is False
    # in the framework modules too, as Horovod's examples call them there (sycl_built: after 0.28)
    import importlib
    kt = importlib.import_module("kolo.torch")
    assert kt.sycl_built() is False and kt.ccl_built() is False
    with pytest.raises(ValueError):
        kolo.mpi_threads_supported()
    assert kolo.__version__ in kolo.build_info()


def test_op_values_match_horovod():
    assert (kolo.Average, kolo.Sum, kolo.Adasum, kolo.Min, kolo.Max, kolo.Product) == (0, 1, 2, 3, 4, 5)


def test_adasum_is_an_op():
    # equal vectors: Adasum gives the vector itself (test_numpy.py checks the arithmetic)
    np.testing.assert_array_equal(kolo.allreduce(np.ones(2, np.float32), op=kolo.Adasum), np.ones(2))


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown reduce op.*Adasum"):
        kolo.allreduce(np.ones(2, np.float32), op=42)


def test_reinit_after_shutdown():
    kolo.shutdown()
    assert not kolo.is_initialized()
    with pytest.raises(ValueError, match="not been initialized"):
        kolo.size()
    with pytest.raises(ValueError):
        kolo.allreduce(np.ones(2, np.float32))
    kolo.init()
    assert kolo.is_initialized()
    out = kolo.allreduce(np.full(3, kolo.rank(), np.float64), op=kolo.Sum, name="after_reinit")
    n = kolo.size()
    assert out.tolist() == [n * (n - 1) / 2] * 3
    assert kolo.global_process_set.ranks == list(range(n))


def test_global_process_set():
    ps = kolo.global_process_set
    assert ps.process_set_id == 0
    assert ps.size() == kolo.size() and ps.rank() == kolo.rank() and ps.included()


def test_process_set_lifecycle():
    n, r = kolo.size(), kolo.rank()
    evens = kolo.add_process_set(list(range(0, n, 2)))
    odds = kolo.add_process_set(kolo.ProcessSet(list(range(1, n, 2))))
    try:
        assert evens.process_set_id not in (None, 0) and odds.process_set_id not in (None, 0, evens.process_set_id)
        mine, other = (evens, odds) if r % 2 == 0 else (odds, evens)
        assert mine.included() and not other.included()
        assert mine.rank() == r // 2 and other.rank() == -1
        assert mine.size() == len(mine.ranks)
        # a collective on my set only involves its members
        got = kolo.allreduce(np.array([r], np.int64), op=kolo.Sum, name="ps", process_set=mine)
        assert got.tolist() == [sum(mine.ranks)]
        gathered = kolo.allgather(np.array([r], np.int64), name="ps", process_set=mine)
        assert gathered.tolist() == mine.ranks
        root = mine.ranks[-1]  # a world rank
        b = kolo.broadcast(np.array([r, r], np.int32), root_rank=root, name="ps", process_set=mine)
        assert b.tolist() == [root, root]
        # not a member: refused at once
        with pytest.raises(ValueError):
            kolo.allreduce(np.ones(1, np.float32), name="ps_not_member", process_set=other)
        with pytest.raises(ValueError, match="duplicate"):
            kolo.add_process_set(list(range(0, n, 2)))
        with pytest.raises(ValueError, match="duplicate"):
            kolo.add_process_set(evens)
    finally:
        assert kolo.remove_process_set(evens)
        assert kolo.remove_process_set(odds)
    assert evens.process_set_id is None and not kolo.remove_process_set(evens)
    with pytest.raises(ValueError):
        kolo.remove_process_set(kolo.global_process_set)


def test_unregistered_process_set_is_refused():
    ps = kolo.ProcessSet([0])
    assert ps.size() is None and ps.included() is None
    with pytest.raises(ValueError, match="not been registered"):
        kolo.allreduce(np.ones(1, np.float32), process_set=ps)


def test_init_with_process_sets():
    kolo.shutdown()
    ps = kolo.ProcessSet([0])
    kolo.init(process_sets=[ps])
    try:
        assert ps.process_set_id is not None and ps.process_set_id != 0
        if kolo.rank() == 0:
            out = kolo.allreduce(np.ones(2, np.float32), op=kolo.Sum, name="ps_init", process_set=ps)
            assert out.tolist() == [1.0, 1.0]
    finally:
        kolo.remove_process_set(ps)


def test_init_comm_subset_is_refused():
    if kolo.size() < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(NotImplementedError):
        kolo.init(comm=[0])


def test_timeline_is_valid_json(tmp_path_factory):
    # every rank writes its own file: rank 0 the path, rank r path.r
    base = os.path.join(str(tmp_path_factory.getbasetemp()), "timeline.json")
    kolo.start_timeline(base, mark_cycles=True)
    for i in range(3):
        kolo.allreduce(np.ones(1000, np.float32), name="timeline_%d" % i)
    kolo.stop_timeline()
    path = base if kolo.rank() == 0 else "%s.%d" % (base, kolo.rank())
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e.get("name") for e in events} | {str(e.get("args", {}).get("name", "")) for e in events}
    text = json.dumps(events)
    assert "allreduce.timeline_0" in text
    assert any(n and n.startswith("NEGOTIATE_ALLREDUCE") for n in names), names
    assert "ALLREDUCE" in names


def test_engine_params_report_the_settings():
    p = kolo.engine_params()
    assert set(p) == {"cycle_time_ms", "fusion_threshold", "autotune", "samples"}
    tuning = os.environ.get("KOLO_AUTOTUNE", os.environ.get("HOROVOD_AUTOTUNE", "0")) not in ("", "0")
    assert p["autotune"] == ("tuning" if tuning else "off") or (tuning and p["autotune"] == "done")
    if not tuning and "KOLO_FUSION_THRESHOLD" not in os.environ and "HOROVOD_FUSION_THRESHOLD" not in os.environ:
        assert p["fusion_threshold"] == 64 << 20
    if not tuning and "KOLO_CYCLE_TIME" not in os.environ and "HOROVOD_CYCLE_TIME" not in os.environ:
        assert p["cycle_time_ms"] == 1.0
    # every rank uses rank 0's fusion threshold (agreed at init)
    mine = np.array([p["fusion_threshold"]], np.int64)
    assert kolo.broadcast(mine, root_rank=0, name="params.fusion")[0] == p["fusion_threshold"]


def test_status_names_the_rank_a_tensor_waits_for():
    """kolo.status() from another thread while this one waits in an allreduce the last rank
    joins only once every other rank's thread has seen it listed: the tensor, the ranks that
    submitted it, the one missing. Valid JSON throughout (a tensor name that is not text)."""
    import threading
    import time
    n, r = kolo.size(), kolo.rank()
    st = kolo.status()
    assert (st["rank"], st["size"], st["pid"]) == (r, n, os.getpid())
    assert st["failed"] is None and st["direct"] is None
    assert st["engine"]["process_sets"][0]["ranks"] == list(range(n))
    name = "status.probe.\u00e9\n"
    flag = "/tmp/kolo-status-test-%s" % os.environ.get("KOLO_JOB_ID", "job")
    seen = []

    def look():  # until this rank's status lists the tensor as submitted by all but the last rank
        for _ in range(400):
            sets = kolo.status()["engine"]["process_sets"]
            mine = [p for p in sets[0]["pending"] if p["name"] == "allreduce." + name]  # Horovod's prefix
            if mine and mine[0]["submitted_by"] == list(range(n - 1)):
                seen.append(mine[0])
                break
            time.sleep(0.05)
        open("%s.%d" % (flag, r), "w").close()

    if r != n - 1:
        t = threading.Thread(target=look)
        t.start()
    else:
        for _ in range(600):  # 30 s at most, then it goes on: the others' check fails
            if all(os.path.exists("%s.%d" % (flag, k)) for k in range(n - 1)):
                break
            time.sleep(0.05)
    kolo.allreduce(np.ones(4, np.float32), name=name)
    if r != n - 1:
        t.join()
        assert seen, "the status never listed the tensor"
        assert seen[0]["kind"] == "allreduce" and seen[0]["missing"] == [n - 1] and seen[0]["seconds"] >= 0
    done = kolo.status()["engine"]["process_sets"][0]["pending"]  # the others may be in the barrier
    assert "allreduce." + name not in [p["name"] for p in done]
    kolo.barrier()
    if r == n - 1:
        for k in range(n - 1):
            os.unlink("%s.%d" % (flag, k))


def test_engine_stats_count_requests():
    before = kolo.engine_stats()
    kolo.allreduce(np.ones(4, np.float32), name="stats")
    after = kolo.engine_stats()
    assert after["requests"] >= before["requests"] + 1
