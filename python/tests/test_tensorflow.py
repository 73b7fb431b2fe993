"""kolo.tensorflow and kolo.keras. Multi-rank (under kolorun, with the TensorFlow venv's python:
scripts/test-python.sh): every collective eagerly and inside tf.function for every dtype, checked
against values computed from the ranks; their gradients; DistributedGradientTape (one op per step, fused,
cached names); Keras's DistributedOptimizer, callbacks and load_model; SyncBatchNormalization against
NumPy batch normalization of the global batch; local (model-parallel) variables; BestModelCheckpoint;
errors. Standalone (outside kolorun): the Keras example trains under kolorun -np 2."""

import os
import re
import shutil
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
tf.get_logger().setLevel("ERROR")  # retracing warnings: the tests trace on purpose

import kolo.keras as hvdk  # noqa: E402
import kolo.tensorflow as hvd  # noqa: E402
from conftest import ROOT, UNDER_KOLORUN  # noqa: E402

import adasum_ref  # noqa: E402
import mix_ref  # noqa: E402

keras = tf.keras
DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
          tf.float64]
MODES = ["eager", "function"]


def n_r():
    return hvd.size(), hvd.rank()


def call(mode, f, *args):
    """f(*args) eagerly, or traced into a tf.function and run as a graph."""
    return f(*args) if mode == "eager" else tf.function(f)(*args)


def f64(t):
    return tf.cast(t, tf.float64).numpy()


def gathered_equal(arrays):
    """True when every rank holds the same values."""
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])[None]
    every = hvdk.allgather(flat)
    return all(np.array_equal(every[0], every[k]) for k in range(every.shape[0]))


# ---- collectives ----

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_every_dtype(mode, dtype):
    n, r = n_r()
    base = np.arange(12).reshape(3, 4) % 6
    x = tf.cast(base * (r + 1), dtype)
    small = tf.cast(tf.fill([4], 1 + r % 2), dtype)
    pair = tf.cast(tf.fill([2], 2 * (r + 1)), dtype)
    shapes = []

    def f(x, small, pair):
        out = (hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Min), hvd.allreduce(x, op=hvd.Max),
               hvd.allreduce(small, op=hvd.Product), hvd.allreduce(pair))
        shapes.append(out[0].shape)  # static, inside tf.function
        return out
    s, mn, mx, p, avg = call(mode, f, x, small, pair)
    assert s.dtype == dtype and shapes[0] == [3, 4]
    assert np.array_equal(f64(s), base * (n * (n + 1) // 2))
    assert np.array_equal(f64(mn), base) and np.array_equal(f64(mx), base * n)
    assert np.array_equal(f64(p), np.full(4, np.prod([1 + k % 2 for k in range(n)])))
    expect = (n + 1) if dtype.is_floating else (n * (n + 1)) // n  # integer averages truncate
    assert np.allclose(f64(avg), expect, rtol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_bool_scale_factors_and_average_keyword(mode):
    n, r = n_r()
    b = tf.constant([True, r == 0, False])
    x = tf.fill([3], float(r + 1))

    def f(b, x):
        return (hvd.allreduce(b, op=hvd.Sum), hvd.allreduce(b, op=hvd.Min),
                hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name="scaled_%s" % mode),
                hvd.allreduce(x, average=False))
    s, mn, scaled, summed = call(mode, f, b, x)
    assert s.numpy().tolist() == [True, True, False] and mn.numpy().tolist() == [True, n == 1, False]
    assert np.allclose(scaled.numpy(), n * (n + 1) / 2 * 0.5)
    assert np.allclose(summed.numpy(), n * (n + 1) / 2)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_uneven_first_dimension(mode):
    n, r = n_r()
    shapes = []

    def f():
        outs = [hvd.allgather(tf.cast(tf.fill([r + 1, 2], r % 2 if d == tf.bool else r), d))
                for d in DTYPES + [tf.bool]]
        shapes.append(outs[0].shape)
        return outs
    expect = np.concatenate([np.full((k + 1, 2), k) for k in range(n)])
    for d, out in zip(DTYPES + [tf.bool], call(mode, f)):
        assert out.dtype == d
        assert np.array_equal(f64(out), expect % 2 if d == tf.bool else expect), d
    assert shapes[0].as_list() == [None, 2] if mode == "function" else [n * (n + 1) // 2, 2]


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_every_dtype(mode):
    n, r = n_r()
    root = n - 1

    def f():
        return [hvd.broadcast(tf.cast(tf.fill([2, 3], r % 2 if d == tf.bool else r), d), root)
                for d in DTYPES + [tf.bool]]
    for d, out in zip(DTYPES + [tf.bool], call(mode, f)):
        assert out.dtype == d and out.shape == [2, 3]
        assert np.array_equal(f64(out), np.full((2, 3), root % 2 if d == tf.bool else root)), d


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_with_and_without_splits(mode):
    n, r = n_r()
    # rank r sends k + 1 rows worth 100 r + k to rank k
    rows = np.concatenate([np.full(k + 1, 100 * r + k) for k in range(n)])
    splits = [k + 1 for k in range(n)]
    even = np.repeat(np.arange(n) + 10 * r, 2)  # two rows to each rank

    def f():
        outs = []
        for d in (tf.float32, tf.int64, tf.bfloat16):
            out, rs = hvd.alltoall(tf.cast(rows, d), splits=splits)
            outs += [out, rs, hvd.alltoall(tf.cast(even, d))]
        return outs
    outs = call(mode, f)
    for i in range(0, len(outs), 3):
        out, rs, plain = outs[i:i + 3]
        if i // 3 == 2:  # bfloat16 holds integers up to 256 exactly
            continue
        assert np.array_equal(f64(out), np.repeat(100 * np.arange(n) + r, r + 1))
        assert rs.dtype == tf.int32 and rs.numpy().tolist() == [r + 1] * n
        assert np.array_equal(f64(plain), np.repeat(10 * np.arange(n) + r, 2))
    assert np.array_equal(f64(outs[8]), np.repeat(10 * np.arange(n) + r, 2))


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_uneven_rows(mode):
    n, r = n_r()
    rows = 2 * n + 1  # rank 0 gets one more row
    x = tf.constant(np.arange(rows)[:, None] * np.ones((1, 2)) * (r + 1), tf.float32)
    shapes = []

    def f(x):
        s, a = hvd.reducescatter(x, op=hvd.Sum), hvd.reducescatter(tf.cast(x, tf.float64))
        i = hvd.reducescatter(tf.cast(x, tf.int32), op=hvd.Sum, name="rs_int_%s" % mode)
        shapes.append(s.shape)
        return s, a, i
    s, a, i = call(mode, f, x)
    start = 0 if r == 0 else 3 + 2 * (r - 1)
    mine = np.arange(start, start + (3 if r == 0 else 2))[:, None] * np.ones((1, 2))
    assert shapes[0].as_list() == [3 if r == 0 else 2, 2]
    assert np.array_equal(s.numpy(), mine * n * (n + 1) / 2)
    assert np.allclose(a.numpy(), mine * (n + 1) / 2)
    assert np.array_equal(i.numpy(), mine * n * (n + 1) / 2)
    with pytest.raises(ValueError, match="scalar"):
        hvd.reducescatter(tf.constant(1.0))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_collectives(mode):
    n, r = n_r()

    def f():
        g = hvd.grouped_allreduce([tf.fill([3], float(r)), tf.fill([2, 2], r), tf.fill([1], np.float64(r))],
                                  op=hvd.Sum)
        ga = hvd.grouped_allgather([tf.fill([1], r), tf.fill([r + 1], 1.0)], name="ga_%s" % mode)
        grs = hvd.grouped_reducescatter([tf.fill([n, 2], float(r)), tf.fill([n], r)], op=hvd.Sum)
        return g + ga + grs
    g0, g1, g2, ga0, ga1, rs0, rs1 = call(mode, f)
    s = n * (n - 1) // 2
    assert g1.dtype == tf.int32 and g2.dtype == tf.float64
    assert np.array_equal(g0.numpy(), [s] * 3) and np.array_equal(g1.numpy(), np.full((2, 2), s))
    assert g2.numpy().tolist() == [s]
    assert ga0.numpy().tolist() == list(range(n)) and ga1.shape[0] == n * (n + 1) // 2
    assert np.array_equal(rs0.numpy(), np.full((1, 2), s)) and rs1.numpy().tolist() == [s]


@pytest.mark.parametrize("mode", MODES)
def test_adasum(mode):
    """op=Adasum against the NumPy tree (adasum_ref.py): allreduce, grouped_allreduce (each tensor its
    own vector), float16 and bfloat16, and its gradient (the Adasum of the gradients, as in Horovod)."""
    n, r = n_r()
    vs = adasum_ref.member_vectors(n, (3, 4), seed=5, dtype=np.float32)
    ws = adasum_ref.member_vectors(n, (6,), seed=6)
    hs = [v.astype(np.float16) for v in adasum_ref.member_vectors(n, (5,), seed=8)]

    def f(x, y, h):
        with tf.GradientTape() as tape:
            tape.watch(y)
            a = hvd.allreduce(x, op=hvd.Adasum, name="tf_adasum")
            gx, gy = hvd.grouped_allreduce([x, y], op=hvd.Adasum, name="tf_adasum_group")
            loss = tf.reduce_sum(gy * tf.constant(ws[(r + 1) % n]))
        return (a, gx, gy, hvd.allreduce(h, op=hvd.Adasum), hvd.allreduce(tf.cast(h, tf.bfloat16), op=hvd.Adasum),
                tape.gradient(loss, y))
    a, gx, gy, h16, hb16, dy = call(mode, f, tf.constant(vs[r]), tf.constant(ws[r]), tf.constant(hs[r]))
    for got, members, dtype in ((a, vs, "float32"), (gx, vs, "float32"), (gy, ws, "float64"), (h16, hs, "float16"),
                                (hb16, [f64(tf.cast(h, tf.bfloat16)) for h in hs], "bfloat16")):
        ref = adasum_ref.adasum(members)
        assert got.dtype.name == dtype
        np.testing.assert_allclose(f64(got), ref, **adasum_ref.tolerance(dtype, ref))
    ref = adasum_ref.adasum([ws[(k + 1) % n] for k in range(n)])
    np.testing.assert_allclose(dy.numpy(), ref, **adasum_ref.tolerance("float64", ref))
    assert gathered_equal([a, gx, gy, f64(h16), f64(hb16)])
    assert np.allclose(hvdk.allreduce(vs[r], op=hvdk.Adasum), a.numpy(), rtol=1e-6)  # the Keras helper


def test_adasum_refusals():
    for dtype in (tf.int32, tf.int64, tf.bool):
        with pytest.raises(ValueError, match="Adasum.*floating-point.*%s" % dtype.name):
            hvd.allreduce(tf.ones([2], dtype), op=hvd.Adasum)
        with pytest.raises(ValueError, match="Adasum.*floating-point"):
            tf.function(lambda x: hvd.grouped_allreduce([tf.ones([2]), x], op=hvd.Adasum))(tf.ones([2], dtype))
    with pytest.raises(ValueError, match="Adasum.*allreduce only"):
        hvd.reducescatter(tf.ones([4, 2]), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="sparse_as_dense"):
        hvd.allreduce(tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), tf.constant([4, 3])), op=hvd.Adasum)
    vs, loss = tape_model()
    with tf.GradientTape() as tape:
        lv = loss()
    with pytest.raises(NotImplementedError, match="sparse_as_dense"):  # the embedding's gradient
        hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(lv, vs)
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy().tolist() == [hvd.size()]  # the job goes on


def test_process_set_and_the_job_as_tensors():
    n, r = n_r()
    if n < 3:
        members = [0]
    else:
        members = [0, n - 1]
    ps = hvd.add_process_set(members)
    try:
        if r in members:
            out = hvd.allreduce(tf.constant([float(r + 1)]), op=hvd.Sum, name="ps_tf", process_set=ps)
            assert out.numpy().tolist() == [float(sum(m + 1 for m in members))]
            got = hvd.broadcast(tf.constant([r]), members[-1], name="ps_bcast", process_set=ps)
            assert got.numpy().tolist() == [members[-1]]
    finally:
        hvd.remove_process_set(ps)

    @tf.function
    def f():
        return hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op(), hvd.process_set_included_op()
    assert [int(v) for v in f()] == [n, r, hvd.local_size(), hvd.local_rank(), 1]
    assert int(hvd.join()) in range(n)
    assert int(tf.function(hvd.barrier)()) == 0


def test_objects_travel():
    n, r = n_r()
    obj = hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1, name="tf_obj")
    assert obj == {"from": n - 1, "list": [n - 1] * 3}
    assert hvd.allgather_object(("rank", r), name="tf_objs") == [("rank", k) for k in range(n)]


# ---- everything at once ----

MIX_DTYPES = {d.name: d for d in DTYPES}
MIX_KINDS = [k for k in mix_ref.KINDS if not k.endswith("_")]  # no in-place operations here


def _mix_run(q, r, name, ps):
    """Runs request q on rank r, eagerly or while a tf.function traces; returns its outputs: a list
    of tensors, or for an alltoall (output, received splits)."""
    dtype = MIX_DTYPES[q["dtype"]]
    ins = [tf.cast(tf.constant(a.astype(np.float64)), dtype) for a in mix_ref.inputs(q, r)]
    kw = {"name": name, "process_set": ps}
    red = {"op": q["op"], "prescale_factor": q["pre"], "postscale_factor": q["post"]}
    if q["kind"] == "ar":
        return [hvd.allreduce(ins[0], **red, **kw)]
    if q["kind"] == "grp":
        return hvd.grouped_allreduce(ins, **red, **kw)
    if q["kind"] == "ag":
        return [hvd.allgather(ins[0], **kw)]
    if q["kind"] == "gag":
        return hvd.grouped_allgather(ins, **kw)
    if q["kind"] == "grs":
        return hvd.grouped_reducescatter(ins, op=q["op"], **kw)
    if q["kind"] == "bc":
        x = ins[0] if r == q["root"] else tf.cast(tf.fill([q["rows"], q["width"]], 99.0), dtype)
        return [hvd.broadcast(x, q["root"], **kw)]
    if q["kind"] == "a2a":
        out, splits = hvd.alltoall(ins[0], splits=mix_ref.a2a_splits(q, r), **kw)
        return [out], splits
    return [hvd.reducescatter(ins[0], op=q["op"], **kw)]


def _mix_check(q, r, got, what):
    want = mix_ref.expect(q, r)
    if q["kind"] == "a2a":
        (got, splits), (want, want_splits) = got, want
        assert np.asarray(splits).tolist() == want_splits, "%s: splits %s, want %s" % (what, splits, want_splits)
    assert len(got) == len(want), what
    for o, wnt in zip(got, want):
        assert o.dtype == MIX_DTYPES[q["dtype"]], "%s: dtype %s, want %s" % (what, o.dtype, q["dtype"])
        mix_ref.check(q, f64(o), wnt, what)
    return got, want


def test_random_mix_of_ops_in_each_ranks_order():
    """The collectives at once, as python/tests/test_torch_ops.py's mix runs them (mix_ref.py: every
    dtype and op, Adasum, scale factors, grouped allreduces, allgathers and reducescatters, rows
    per rank, alltoall splits, a process set beside the world under the same names, names reused
    with other kinds and shapes every step). kolo.tensorflow's eager ops block, so each rank runs a step's operations in threads
    of its own, started in its own order with its own pauses; a quarter of the steps run them in
    one tf.function instead (in program order, the same on every rank). Every element is checked,
    and some outputs are kept and checked again after every step (their memory is kolo._pool's)."""
    assert _mix(60).heard == []


@pytest.mark.skipif(not os.environ.get("KT_MIX_KILL"), reason="a rank dies: test_a_rank_that_dies_in_the_mix_... "
                    "runs it in a job of its own")
def test_random_mix_a_rank_dies():
    """The mix above, where one rank leaves without a word at a point of a step (mix_ref.fate): in
    one of its threads before an operation, or while it waits for one, or before a tf.function's
    call. Every survivor hears of it; each of its operations, eager or in the graph, either
    completes with the right values or raises an error naming the rank that died, and so does what
    it runs after."""
    fate = _mix(60, kill=True)
    said = fate.survived(hvd.rank())
    with pytest.raises(hvd.HorovodInternalError, match="rank %d\\b" % fate.victim):
        hvd.allreduce(tf.ones([1]), name="after.the.death")
    print(said)


def _mix(steps, kill=False):
    """Runs the mix for steps; with kill, one rank dies (mix_ref.fate). Returns the mix_ref.Fate,
    with the errors this rank's operations ended with, each checked to name the victim."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    n, r = n_r()
    seed, plan, ps_members = mix_ref.start(n)
    fate = mix_ref.Fate(seed, n, steps, kill)
    ps = hvd.add_process_set(ps_members) if ps_members else None
    kept = []

    def run(q, j, pause, dies=False):
        time.sleep(pause)
        if dies:
            os._exit(0)  # no shutdown, no goodbye: as a crash (the rank's other threads may be in theirs)
        return _mix_run(q, r, "mix.%d" % j, ps if q["members"] is ps_members else hvd.global_process_set)
    try:
        for step in range(steps):
            mine = mix_ref.rank_rng(seed, r, step)
            reqs = [mix_ref.plan_one(plan, n, ps_members, list(MIX_DTYPES), MIX_KINDS)
                    for _ in range(plan.randint(1, 8))]
            here = [j for j in range(len(reqs)) if r in reqs[j]["members"]]
            dies = step == fate.step and r == fate.victim
            if dies and not here:
                os._exit(0)
            waits, at = mix_ref.kill_point(fate.point, len(here)) if dies else (None, -1)
            outs = {}
            if plan.random() < 0.25:
                if dies:
                    os._exit(0)
                try:
                    outs = dict(zip(here, tf.function(lambda: [run(reqs[j], j, 0) for j in here])()))
                except (hvd.HorovodInternalError, tf.errors.OpError) as e:
                    fate.lost(e, "step %d, a tf.function of %d operations" % (step, len(here)))
            else:
                mine.shuffle(here)
                with ThreadPoolExecutor(max_workers=max(1, len(here))) as pool:
                    futs = {j: pool.submit(run, reqs[j], j, mine.choice([0, 0, 0.001, 0.003]),
                                           waits is False and k == at) for k, j in enumerate(here)}
                    mine.shuffle(here)
                    for k, j in enumerate(here):
                        if waits and k == at:
                            os._exit(0)
                        try:
                            outs[j] = futs[j].result()
                        except (hvd.HorovodInternalError, tf.errors.OpError) as e:
                            fate.lost(e, "step %d, %s 'mix.%d'" % (step, reqs[j]["kind"], j))
            for j in outs:
                q = reqs[j]
                got, want = _mix_check(q, r, outs[j], "step %d, %s 'mix.%d'" % (step, q["kind"], j))
                if q["keep"]:
                    kept.extend((q, o, w, "step %d, 'mix.%d' (kept)" % (step, j)) for o, w in zip(got, want))
            for q, o, w, what in kept:  # nothing reused an output that is still alive
                assert o.dtype == MIX_DTYPES[q["dtype"]], what
                mix_ref.check(q, f64(o), w, what)
            mine.shuffle(kept)
            del kept[12:]
            if fate.heard:  # the victim died: this step's operations have all ended
                break
    finally:
        if ps is not None and fate.victim < 0:  # (after a death, the engine has stopped)
            hvd.barrier()
            hvd.remove_process_set(ps)
    return fate


# ---- gradients ----

@pytest.mark.parametrize("mode", MODES)
def test_allreduce_allgather_broadcast_gradients(mode):
    n, r = n_r()
    v = tf.Variable(tf.ones([3]))
    w = tf.Variable(tf.ones([r + 1, 2]))
    u = tf.Variable(tf.fill([3], float(r + 1)))
    total = n * (n + 1) // 2
    weights = tf.constant(np.arange(1, total + 1, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32))

    def f():
        with tf.GradientTape(persistent=True) as tape:
            a = tf.reduce_sum(hvd.allreduce(v * (r + 1), op=hvd.Sum))
            g = tf.reduce_sum(hvd.allgather(w) * weights)
            b = tf.reduce_sum(hvd.broadcast(u, n - 1) * (r + 1))
        return tape.gradient(a, v), tape.gradient(g, w), tape.gradient(b, u)
    gv, gw, gu = call(mode, f)
    assert np.allclose(gv.numpy(), n * (r + 1))  # allreduce of the ones, times r + 1
    off = r * (r + 1) // 2
    assert np.allclose(gw.numpy(), weights.numpy()[off:off + r + 1])  # this rank's rows
    assert np.allclose(gu.numpy(), (n + 1) / 2 if r == n - 1 else 0)  # root: the average; others zero


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_reducescatter_grouped_gradients(mode):
    n, r = n_r()
    x = tf.Variable(tf.ones([n * (n + 1) // 2, 2]))
    y = tf.Variable(tf.ones([2 * n, 3]))
    z = [tf.Variable(tf.ones([2])), tf.Variable(tf.ones([1], tf.float64))]

    def f():
        with tf.GradientTape(persistent=True) as tape:
            out, _ = hvd.alltoall(x, splits=[k + 1 for k in range(n)])
            a = tf.reduce_sum(out) * (r + 1)
            b = tf.reduce_sum(hvd.reducescatter(y, op=hvd.Sum)) * (r + 1)
            g = hvd.grouped_allreduce([z[0] * (r + 1), z[1]], op=hvd.Sum)
            c = tf.reduce_sum(g[0]) + tf.cast(tf.reduce_sum(g[1]), tf.float32)
        return tape.gradient(a, x), tape.gradient(b, y), tape.gradient(c, z)
    gx, gy, (gz0, gz1) = call(mode, f)
    # the rows sent to rank k come back with rank k's factor k + 1; the rows rank k kept likewise
    assert np.allclose(gx.numpy()[:, 0], np.repeat(np.arange(n) + 1, np.arange(n) + 1))
    assert np.allclose(gy.numpy()[:, 0], np.repeat(np.arange(n) + 1, 2))
    assert np.allclose(gz0.numpy(), n * (r + 1)) and np.allclose(gz1.numpy(), n)


def tape_model():
    n, r = n_r()
    rng = np.random.RandomState(7)
    vs = [tf.Variable(rng.randn(4, 3).astype(np.float32), name="w"),
          tf.Variable(rng.randn(3).astype(np.float32), name="b"),
          tf.Variable(rng.randn(10, 3).astype(np.float32), name="emb")]
    x = tf.constant(np.random.RandomState(r).randn(5, 4).astype(np.float32))
    ids = tf.constant([r % 10, 3, 3])

    def loss():
        h = tf.matmul(x, vs[0]) + vs[1]
        return tf.reduce_sum(h * h) * (r + 1) + tf.reduce_sum(tf.gather(vs[2], ids) * (r + 2))
    return vs, loss


def dense(g):
    return tf.convert_to_tensor(g).numpy()


@pytest.mark.parametrize("options", [{}, {"compression": hvd.Compression.fp16}, {"groups": 2},
                                     {"sparse_as_dense": True}, {"op": hvd.Sum}, {"gradient_predivide_factor": 2.0}],
                         ids=["plain", "fp16", "groups", "sparse_as_dense", "sum", "predivide"])
@pytest.mark.parametrize("mode", MODES)
def test_distributed_gradient_tape_averages(mode, options):
    vs, loss = tape_model()
    with tf.GradientTape() as tape:
        lv = loss()
    local = [dense(g) for g in tape.gradient(lv, vs)]
    op = options.get("op", hvd.Average)
    expect = [hvd.allreduce(tf.constant(g), op=op).numpy() for g in local]

    def f():
        with tf.GradientTape() as t:
            lv = loss()
        return hvd.DistributedGradientTape(t, **options).gradient(lv, vs)
    got = call(mode, f)
    assert isinstance(got[2], tf.IndexedSlices) != bool(options.get("sparse_as_dense"))
    tol = 2e-2 if "compression" in options else 1e-5
    for g, e in zip(got, expect):
        assert np.allclose(dense(g), e, rtol=tol, atol=tol)
    if hvd.size() > 1:
        assert not np.allclose(local[0], expect[0])  # the ranks' gradients differ: averaging did something


def test_distributed_gradient_tape_around_the_recording():
    vs, loss = tape_model()
    with hvd.DistributedGradientTape(tf.GradientTape()) as tape:
        lv = loss()
    g = tape.gradient(lv, {"w": vs[0]})
    assert isinstance(tape, tf.GradientTape) and set(g) == {"w"}
    assert gathered_equal([g["w"]])


@pytest.mark.parametrize("mode", MODES)
def test_distributed_gradient_tape_adasum(mode):
    """op=Adasum combines every gradient as its own vector (Horovod's rule for TensorFlow 2 and Keras:
    gradients, not updates); the embedding's slices must be made dense."""
    n, _ = n_r()
    vs, loss = tape_model()
    with tf.GradientTape() as tape:
        lv = loss()
    local = [dense(g) for g in tape.gradient(lv, vs)]
    every = [hvdk.allgather(g[None]) for g in local]  # every rank's gradients

    def f():
        with tf.GradientTape() as t:
            lv = loss()
        return hvd.DistributedGradientTape(t, op=hvd.Adasum, sparse_as_dense=True, groups=2).gradient(lv, vs)
    got = call(mode, f)
    for g, members in zip(got, every):
        ref = adasum_ref.adasum(list(members))
        np.testing.assert_allclose(dense(g), ref, **adasum_ref.tolerance("float32", ref))
        if n > 1:
            assert not np.allclose(ref, members.mean(0), rtol=1e-3)  # neither the average
            assert not np.allclose(ref, members.sum(0), rtol=1e-3)  # nor the sum


def test_gradient_batch_is_one_op_fused_and_cached():
    """Inside tf.function a step's gradients are one numpy_function op; the engine fuses them, and
    their names (the variables') are cache hits from the second step on."""
    r = hvd.rank()
    vs = [tf.Variable(tf.fill([16 + i], 1.0), name="v%d" % i) for i in range(8)]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            lv = tf.add_n([tf.reduce_sum(v * v) * (r + 1) for v in vs])
        return hvd.DistributedGradientTape(tape).gradient(lv, vs)
    graph = step.get_concrete_function().graph
    assert [op.type for op in graph.get_operations()].count("PyFunc") == 1
    before = hvd.engine_stats()
    for _ in range(4):
        grads = step()
    after = hvd.engine_stats()
    d = {k: after[k] - before[k] for k in after}
    assert d["requests"] == 32
    assert d["collectives"] <= 16, d  # 8 gradients per step travel together
    assert d["cache_hits"] >= 24, d  # steps 2 to 4
    n = hvd.size()
    assert np.allclose(grads[0].numpy(), 2 * (n + 1) / 2)


def test_unnamed_ops_in_a_function_keep_their_names():
    x = tf.ones([5])
    f = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum))
    f(x)
    before = hvd.engine_stats()["cache_hits"]
    for _ in range(3):
        out = f(x)
    assert hvd.engine_stats()["cache_hits"] - before >= 3
    assert np.allclose(out.numpy(), hvd.size())


# ---- errors ----

def test_mismatched_shapes_name_the_tensor():
    n, r = n_r()
    if n == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(hvd.HorovodInternalError) as e:
        hvd.allreduce(tf.ones([2 + r]), name="tf_mismatch_eager")
    assert "tf_mismatch_eager" in str(e.value) and re.search(r"rank \d", str(e.value)), str(e.value)
    # eagerly also Horovod's class, with kolo's message
    assert isinstance(e.value, tf.errors.FailedPreconditionError) and e.value.message == str(e.value)
    with pytest.raises(tf.errors.FailedPreconditionError, match="tf_mismatch_dtype"):
        hvd.allgather(tf.ones([1], tf.float32 if r == 0 else tf.int32), name="tf_mismatch_dtype")

    @tf.function
    def f(x):
        return hvd.allgather(x, name="tf_mismatch_graph")
    with pytest.raises(tf.errors.OpError) as e:
        f(tf.ones([2, 1 + r]))
    assert "tf_mismatch_graph" in e.value.message and "HorovodInternalError" in e.value.message, e.value.message
    # the job goes on
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy().tolist() == [n]


def test_refusals_are_clear():
    with pytest.raises(ValueError, match="complex64 is not supported"):
        hvd.allreduce(tf.constant([1 + 2j], tf.complex64))
    with pytest.raises(ValueError, match="string is not supported"):
        hvd.broadcast(tf.constant(["a"]), 0)
    with pytest.raises(ValueError, match="unknown reduce op"):
        hvd.allreduce(tf.ones([1]), op=42)
    with pytest.raises(NotImplementedError, match="XLA"):
        tf.function(lambda x: hvd.allreduce(x), jit_compile=True)(tf.ones([2]))
    with pytest.raises(NotImplementedError, match="DistributedGradientTape"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(ValueError, match="already"):
        hvdk.DistributedOptimizer(hvdk.DistributedOptimizer(keras.optimizers.SGD()))
    with pytest.raises(NotImplementedError, match="BroadcastGlobalVariablesCallback"):
        hvdk.broadcast_global_variables(0)
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hvd.broadcast_global_variables(0)
    with pytest.raises(NotImplementedError, match="TensorFlow 1 SessionRunHook.*broadcast_variables"):
        hvd.BroadcastGlobalVariablesHook(0)
    # a bad call is a ValueError and, eagerly as inside tf.function, TensorFlow's InvalidArgumentError
    if hvd.size() > 1:
        for f in (hvd.alltoall, tf.function(hvd.alltoall)):
            with pytest.raises(tf.errors.InvalidArgumentError, match="divisible"):
                f(tf.ones([hvd.size() + 1]))
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(tf.ones([2]), splits=[1] * (hvd.size() + 1))


def test_tensorflow_1_graphs_are_refused():
    # run by a session, independent collectives would start in a different order on each rank
    with tf.Graph().as_default():
        v = tf.Variable(1.0)
        for build in (lambda: hvd.allreduce(tf.ones([2])), lambda: hvd.allgather(tf.ones([2])),
                      lambda: hvd.broadcast_variables([v], 0), lambda: hvd.join()):
            with pytest.raises(NotImplementedError, match="TensorFlow 1 graphs .* tf.function"):
                build()
        assert hvd.size_op().dtype == tf.int32  # the job's shape reads no peer: still there
    # tf.function: the same graph, run in program order; tf.compat.v1.global_variables() is empty
    @tf.function
    def f():
        hvd.broadcast_global_variables(0)
        return hvd.allreduce(tf.ones([2]), op=hvd.Sum)
    assert f().numpy().tolist() == [hvd.size()] * 2


def test_many_independent_collectives_in_a_function():
    # tf.function runs them in program order on every rank: none waits for one its peer has not started
    n, r = n_r()

    @tf.function
    def f():
        xs = [tf.fill([3], float(r + i)) for i in range(12)]
        return [hvd.allgather(x) for x in xs] + [hvd.allreduce(x, op=hvd.Sum) for x in xs]
    outs = f()
    for i in range(12):
        assert np.array_equal(outs[i].numpy(), np.repeat(np.arange(n) + i, 3).astype(np.float32))
        assert outs[12 + i].numpy().tolist() == [n * i + n * (n - 1) / 2] * 3


@pytest.mark.parametrize("mode", MODES)
def test_outputs_are_kept_blocks_taken_without_a_copy(mode):
    # the output tensor's memory is a kolo._pool block (TensorFlow took it, did not copy it): the
    # block is idle again once the tensor goes, and serves the next call
    from kolo import _pool

    def idle_blocks(nbytes):
        return {b.ctypes.data for b in _pool.outputs._free.get(nbytes, [])}
    n = hvd.size()
    _pool.outputs.clear()  # idle blocks are kept up to the most bytes out at once: start with none
    nbytes = 1 << 17  # 64 KiB and more: kept
    for dtype in (tf.float32, tf.float16, tf.int64):  # (bfloat16 outputs are copied: ml_dtypes' type)
        x = tf.ones([nbytes // dtype.size], dtype)

        def f(x):
            return hvd.allreduce(x, op=hvd.Sum)
        f = f if mode == "eager" else tf.function(f)
        out = f(x)
        assert out.dtype == dtype and np.all(f64(out) == n)
        addr = out._numpy().ctypes.data  # the tensor's own memory
        assert addr not in idle_blocks(nbytes), dtype
        del out
        assert addr in idle_blocks(nbytes), dtype
        out = f(x)
        assert out._numpy().ctypes.data == addr, dtype  # the one idle block of that size
        del out
    # an allgather's output (allocated by the engine, then copied into a block) goes the same way
    _pool.outputs.clear()
    out = call(mode, lambda x: hvd.allgather(x), tf.ones([1 << 14, 2]))
    assert out.shape[0] == n << 14
    addr = out._numpy().ctypes.data
    del out
    assert addr in idle_blocks(n << 17)
    # from 1 MiB it is the engine's own block, taken as the tensor's memory: the same block serves
    # the next call once the tensor goes
    big = tf.fill([1 << 18, 2], float(hvd.rank()))
    out = call(mode, lambda x: hvd.allgather(x), big)
    addr = out._numpy().ctypes.data
    assert addr % 64 == 0 and [f64(out)[i << 18, 0] for i in range(n)] == list(range(n))
    del out
    out = call(mode, lambda x: hvd.allgather(x), big)
    assert out._numpy().ctypes.data == addr and f64(out)[-1, 1] == n - 1


def test_horovod_util_helpers():
    from kolo.tensorflow.util import refs_to_vars, vars_to_refs
    assert hvd._executing_eagerly() and not tf.function(lambda: tf.constant(hvd._executing_eagerly()))().numpy()
    vs = [tf.Variable(1.0), [tf.Variable(2.0)]]
    refs = vars_to_refs(vs)
    assert {refs: 1}[vars_to_refs(vs)] == 1  # hashable, equal for the same variables
    assert refs_to_vars(refs)[1][0] is vs[1][0]
    root = hvd.rank() == 0
    fn = hvd.broadcast_object_fn(root_rank=0, name="util_obj")
    assert fn({"from": hvd.rank()} if root else None) == {"from": 0}


# ---- Keras ----

def small_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])


def rank_data(r, n=8):
    rng = np.random.RandomState(100 + r)
    x = rng.randn(n, 3).astype(np.float32)
    return x, (x[:, :2] * (r + 1) + r).astype(np.float32)


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_keras_optimizer_applies_the_average(run_eagerly):
    """One step on the whole local batch moves the weights by lr times the ranks' average gradient;
    later steps on rank-dependent data keep every rank's weights identical."""
    n, r = n_r()
    model = small_model(0)  # the same initial weights on every rank
    x, y = rank_data(r)
    with tf.GradientTape() as tape:
        lv = keras.losses.MeanSquaredError()(y, model(x))
    local = tape.gradient(lv, model.trainable_variables)
    avg = [hvd.allreduce(g).numpy() for g in local]
    w0 = [v.numpy() for v in model.trainable_variables]
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  run_eagerly=run_eagerly)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    for v, w, g in zip(model.trainable_variables, w0, avg):
        assert np.allclose(v.numpy(), w - 0.1 * g, atol=1e-5)
    if n > 1:
        assert not np.allclose(local[0].numpy(), avg[0])
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert gathered_equal(model.weights)


def test_keras_optimizer_with_adasum():
    """Keras's DistributedOptimizer(op=Adasum) applies the Adasum of the ranks' gradients (Horovod's
    Keras optimizer allreduces the gradients with the given op)."""
    n, r = n_r()
    model = small_model(0)
    x, y = rank_data(r)
    with tf.GradientTape() as tape:
        lv = keras.losses.MeanSquaredError()(y, model(x))
    every = [hvdk.allgather(g.numpy()[None]) for g in tape.gradient(lv, model.trainable_variables)]
    w0 = [v.numpy() for v in model.trainable_variables]
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvdk.Adasum), loss="mse")
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    for v, w, members in zip(model.trainable_variables, w0, every):
        np.testing.assert_allclose(v.numpy(), w - 0.1 * adasum_ref.adasum(list(members)), atol=1e-5)
    assert gathered_equal(model.weights)


def test_broadcast_callback_makes_weights_equal():
    n, r = n_r()
    model = small_model(10 + r)  # different on every rank
    root = n - 1  # lr 0, but momentum: the weights move by the velocities, which differ by rank
    init = hvdk.allgather(np.concatenate([w.numpy().ravel() for w in model.weights])[None])
    if n > 1:
        assert not np.array_equal(init[0], init[root])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0, momentum=0.5))
    opt.build(model.trainable_variables)
    for v in opt.variables:  # a different optimizer state on every rank too
        v.assign(tf.cast(tf.fill(v.shape, r + 1), v.dtype))
    model.compile(optimizer=opt, loss="mse")
    x, y = rank_data(r)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(root)])
    assert gathered_equal(model.weights + list(opt.variables))
    assert int(opt.iterations.numpy()) == (root + 1) + 2  # root's count, then two batches


def test_metric_average_callback():
    n, r = n_r()
    logs = {"loss": float(r), "acc": np.float32(2 * r), "note": "text"}
    hvdk.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == {"loss": (n - 1) / 2, "acc": float(n - 1), "note": "text"}


def lr_trace(cb, epochs, steps=4):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    cb.set_model(model)
    cb.set_params({"steps": steps, "epochs": epochs})
    cb.on_train_begin()
    out = []
    for e in range(epochs):
        cb.on_epoch_begin(e)
        for b in range(steps):
            cb.on_batch_begin(b)
            out.append(float(model.optimizer.learning_rate))
            cb.on_batch_end(b)
        logs = {}
        cb.on_epoch_end(e, logs)
        assert np.isclose(logs["lr"], out[-1])
    return out


def test_learning_rate_warmup_and_schedule():
    n, _ = n_r()
    got = lr_trace(hvdk.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2, momentum_correction=False), 3)
    want = [0.4 * ((e + b / 4 + 1 / 4) * (n - 1) / 2 + 1) / n for e in range(2) for b in range(4)] + [0.4] * 4
    assert np.allclose(got, want, rtol=1e-6)
    got = lr_trace(hvdk.callbacks.LearningRateScheduleCallback(0.4, 0.5, start_epoch=1, end_epoch=2), 3)
    assert np.allclose(got, [0.1] * 4 + [0.2] * 8)
    got = lr_trace(hvdk.callbacks.LearningRateScheduleCallback(1.0, lambda e: 1 / (1 + e), staircase=False), 1)
    assert np.allclose(got, [1 / (1 + b / 4) for b in range(4)])


def test_warmup_says_it_ended_on_rank_0_only(capsys):
    _, r = n_r()
    lr_trace(hvdk.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=1, verbose=1), 1)
    said = "finished gradual learning rate warmup" in capsys.readouterr().out
    assert said == (r == 0)  # Horovod's: one line per job, not one per rank


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # Keras 3.15's save on NumPy 2
def test_keras_value_helpers_and_load_model(tmp_path):
    n, r = n_r()
    assert np.allclose(hvdk.allreduce(np.array([r, 1.0])), [(n - 1) / 2, 1.0])
    assert hvdk.allgather(np.array([r])).tolist() == list(range(n))
    assert hvdk.broadcast(np.array([r, r]), n - 1).tolist() == [n - 1] * 2
    assert hvdk.reducescatter(np.ones((n, 2)) * r, op=hvdk.Sum).tolist() == [[n * (n - 1) / 2] * 2]

    model = small_model(0)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
    x, y = rank_data(r)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert not getattr(plain.optimizer, "_kolo_distributed", False)  # saved as a plain SGD
    loaded = hvdk.load_model(path)
    assert loaded.optimizer._kolo_distributed and type(loaded.optimizer).__name__ == "SGD"
    assert int(loaded.optimizer.iterations.numpy()) == 2  # its state came back
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert gathered_equal(loaded.weights)


# ---- local gradient aggregation (backward_passes_per_step) ----

def linear_data(r, steps, batch):
    rng = np.random.RandomState(300 + r)
    x = rng.randn(steps * batch, 3).astype(np.float32)
    return x, (x[:, :2] * (r + 1) - r).astype(np.float32)


def simulate_aggregation(w, b, n, passes, average, steps, batch, lr, momentum):
    """Model.fit of a Dense(2) layer under MSE with SGD(lr, momentum) and backward_passes_per_step,
    in NumPy, over every rank's linear_data: each step adds each rank's gradient to that rank's sum;
    every passes-th step applies the ranks' average of their sums (divided by passes if average)."""
    data = [linear_data(k, steps, batch) for k in range(n)]
    w, b = w.astype(np.float64), b.astype(np.float64)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    sw, sb = np.zeros((n,) + w.shape), np.zeros((n,) + b.shape)
    for s in range(steps):
        for k, (x, y) in enumerate(data):
            xb, yb = x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
            err = (xb @ w + b - yb) / batch  # d loss / d prediction: the loss is the mean over 2 outputs
            sw[k] += xb.T @ err
            sb[k] += err.sum(0)
        if (s + 1) % passes == 0:
            gw, gb = sw.mean(0) / (passes if average else 1), sb.mean(0) / (passes if average else 1)
            vw, vb = momentum * vw - lr * gw, momentum * vb - lr * gb
            w, b = w + vw, b + vb
            sw[:], sb[:] = 0, 0
    return w, b


@pytest.mark.parametrize("passes,average,run_eagerly", [(2, False, False), (2, True, True), (3, False, True),
                                                        (3, True, False)],
                         ids=["2-sum-graph", "2-average-eager", "3-sum-eager", "3-average-graph"])
def test_keras_fit_aggregates_gradients_locally(passes, average, run_eagerly):
    """Model.fit with backward_passes_per_step: after 7 steps the weights are the NumPy computation's
    (the last cycle left unfinished), the same on every rank; the ranks communicate on the update
    steps only (one request per gradient), and optimizer.iterations counts every step (Horovod's)."""
    n, r = n_r()
    steps, batch, lr, momentum = 7, 4, 0.1, 0.5
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    w0, b0 = [v.numpy() for v in model.trainable_variables]
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=momentum), backward_passes_per_step=passes,
                                    average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    x, y = linear_data(r, steps, batch)
    before = hvd.engine_stats()["requests"]
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    assert hvd.engine_stats()["requests"] - before == 2 * (steps // passes) * (n > 1)
    assert int(opt.iterations.numpy()) == steps
    w, b = simulate_aggregation(w0, b0, n, passes, average, steps, batch, lr, momentum)
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.trainable_variables[1].numpy(), b, rtol=1e-4, atol=1e-5)
    assert gathered_equal(model.weights)
    assert not any("kolo" in v.name for v in opt.variables)  # the sums are not saved with the optimizer


def traced(mode, f):
    """f itself, or one tf.function of it that every call reuses (so its state lives in variables)."""
    return f if mode == "eager" else tf.function(f)


@pytest.mark.filterwarnings("ignore:Gradients do not exist")  # agg_u has none, on purpose
@pytest.mark.parametrize("options", [{}, {"op": hvd.Sum, "groups": 1, "compression": hvd.Compression.fp16}],
                         ids=["average", "sum-grouped-fp16"])
@pytest.mark.parametrize("mode", MODES)
def test_aggregation_in_a_custom_loop(mode, options):
    """apply_gradients with backward_passes_per_step=3 and average_aggregated_gradients: the calls
    between updates send nothing to the engine and change no weight; every third reduces (op) the
    ranks' sums of three passes, divides by three and applies that; a variable whose gradient is
    None stays as it is; iterations counts every call."""
    n, r = n_r()
    v = tf.Variable(tf.ones([3]), name="agg_v")
    w = tf.Variable(tf.ones([2, 2]), name="agg_w")
    u = tf.Variable(tf.ones([2]), name="agg_u")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=3,
                                   average_aggregated_gradients=True, **options)

    def step(k):
        k = tf.cast(k, tf.float32)
        opt.apply_gradients([((k + 1) * (r + 1) * tf.ones([3]), v), (None, u), ((r + 1 - k) * tf.ones([2, 2]), w)])
    f = traced(mode, step)
    per_update = 2 * (n > 1)  # requests: one per tensor, grouped or not
    ranks = np.arange(1, n + 1)
    reduce = np.sum if options.get("op") == hvd.Sum else np.mean
    ev = ew = 1.0
    for k in range(7):
        before = hvd.engine_stats()["requests"]
        f(tf.constant(k))
        update = (k + 1) % 3 == 0
        assert hvd.engine_stats()["requests"] - before == (per_update if update else 0), k
        if update:
            cycle = np.arange(k - 2, k + 1)
            ev -= reduce(ranks * (cycle + 1).sum()) / 3
            ew -= reduce(ranks * 3 - cycle.sum()) / 3
        assert np.allclose(v.numpy(), ev) and np.allclose(w.numpy(), ew), (k, v.numpy(), ev, w.numpy(), ew)
        assert int(opt.iterations.numpy()) == k + 1
    assert np.array_equal(u.numpy(), np.ones(2))


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_of_sparse_gradients_and_adasum(mode):
    """An embedding's tf.IndexedSlices are refused without sparse_as_dense (Horovod's rule) and summed
    into a dense buffer with it (a repeated row counts twice); op=Adasum combines the ranks' sums of
    the passes."""
    n, r = n_r()
    emb = tf.Variable(tf.zeros([5, 2]), name="agg_emb")

    def sparse_step(opt, k):
        values = tf.fill([3, 2], tf.cast(k, tf.float32) + 1)
        opt.apply_gradients([(tf.IndexedSlices(values, tf.constant([r % 5, 1, 1]), tf.constant([5, 2])), emb)])
    refusing = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    with pytest.raises(ValueError, match="sparse_as_dense=True"):
        traced(mode, sparse_step)(refusing, tf.constant(0))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2, sparse_as_dense=True)
    f = traced(mode, lambda k: sparse_step(opt, k))
    for k in range(2):
        f(tf.constant(k))
    every = np.zeros((n, 5, 2))
    for k in range(n):
        every[k, k % 5] += 3  # passes 1 and 2
        every[k, 1] += 2 * 3
    assert np.allclose(emb.numpy(), -every.mean(0))

    vs = adasum_ref.member_vectors(n, (4,), seed=11, dtype=np.float32)
    ws = adasum_ref.member_vectors(n, (4,), seed=12, dtype=np.float32)
    a = tf.Variable(tf.zeros([4]), name="agg_adasum")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2, op=hvd.Adasum,
                                   average_aggregated_gradients=True)
    f = traced(mode, lambda g: opt.apply_gradients([(g, a)]))
    f(tf.constant(vs[r]))
    assert np.array_equal(a.numpy(), np.zeros(4))
    f(tf.constant(ws[r]))
    ref = adasum_ref.adasum([vs[k] + ws[k] for k in range(n)]) / 2
    np.testing.assert_allclose(-a.numpy(), ref, **adasum_ref.tolerance("float32", ref))
    assert gathered_equal([a])


def test_backward_passes_per_step_refusals():
    for bad, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), ("2", TypeError), (True, TypeError),
                       (None, TypeError)):
        with pytest.raises(error, match="backward_passes_per_step must be"):
            hvdk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=bad)
    assert hvdk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=np.int64(2))
    if hasattr(keras.optimizers.SGD(), "gradient_accumulation_steps"):  # Keras 3's own accumulation
        with pytest.raises(ValueError, match="gradient_accumulation_steps=2 would both"):
            hvdk.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2), backward_passes_per_step=2)
    with pytest.raises(TypeError, match="DistributedOptimizer.*backward_passes_per_step=N"):
        hvd.DistributedGradientTape(tf.GradientTape(), backward_passes_per_step=2)


# ---- SyncBatchNormalization ----

def uneven_rows(n):
    """Rows per rank: uneven, and with 3 ranks one rank has none."""
    return [3, 1, 0][:n] if n >= 3 else [3, 1][:n]


def global_batch(shape, seed=3):
    """The global batch (rows as uneven_rows), this rank's slice of it, and its rows' offset."""
    n, r = n_r()
    rows = uneven_rows(n)
    rng = np.random.RandomState(seed)
    x = rng.normal(2.0, 3.0, (sum(rows),) + shape).astype(np.float32)
    lo = sum(rows[:r])
    return x, x[lo:lo + rows[r]], slice(lo, lo + rows[r])


def bn_reference(x, w, gamma, beta, eps):
    """NumPy batch normalization over every axis but the last, with the gradients of sum(w * y)."""
    axes = tuple(range(x.ndim - 1))
    mean, var = x.mean(axes), x.var(axes)
    xhat = (x - mean) / np.sqrt(var + eps)
    y = gamma * xhat + beta
    dgamma, dbeta = (w * xhat).sum(axes), w.sum(axes)
    dx = gamma / np.sqrt(var + eps) * (w - w.mean(axes) - xhat * (w * xhat).mean(axes))
    return mean, var, y, dx, dgamma, dbeta


@pytest.mark.parametrize("mode", MODES)
def test_sync_batch_norm_uses_the_global_batch(mode):
    """Output and gradients are plain batch normalization's on the concatenated global batch
    (uneven rows per rank, one rank empty at 3 ranks), for a loss summed over the ranks; the moving
    statistics follow the global moments, identical on every rank; inference uses them."""
    n, r = n_r()
    xg, x, mine = global_batch((2, 3))
    wg = np.random.RandomState(4).randn(*xg.shape).astype(np.float32)
    layer = hvd.SyncBatchNormalization(momentum=0.75, epsilon=1e-3, gamma_initializer="ones")
    layer.build((None, 2, 3))
    layer.gamma.assign([0.5, 2.0, -1.0])
    layer.beta.assign([0.1, 0.0, 3.0])
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()

    def step(x, w):
        with tf.GradientTape() as t:
            t.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * w)
        return (y,) + tuple(t.gradient(loss, [x, layer.gamma, layer.beta]))
    mean, var, y_ref, dx_ref, dg_ref, db_ref = bn_reference(xg.astype(np.float64), wg, gamma, beta, 1e-3)
    mm, mv = np.zeros(3), np.ones(3)
    for k in range(2):  # the moving statistics after two steps
        y, dx, dg, db = call(mode, step, tf.constant(x), tf.constant(wg[mine]))
        mm, mv = 0.75 * mm + 0.25 * mean, 0.75 * mv + 0.25 * var
    np.testing.assert_allclose(y.numpy(), y_ref[mine], atol=1e-5)
    np.testing.assert_allclose(dx.numpy(), dx_ref[mine], atol=1e-5)
    np.testing.assert_allclose(hvdk.allreduce(dg.numpy(), op=hvd.Sum), dg_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hvdk.allreduce(db.numpy(), op=hvd.Sum), db_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.moving_mean.numpy(), mm, rtol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), mv, rtol=1e-5)
    assert gathered_equal([layer.moving_mean, layer.moving_variance])
    out = call(mode, lambda x: layer(x, training=False), tf.constant(x))  # inference: no collective
    np.testing.assert_allclose(out.numpy(), gamma * (x - mm) / np.sqrt(mv + 1e-3) + beta, atol=1e-5)


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_sync_batch_norm_in_fit(run_eagerly):
    """Under Model.fit (one step per rank on an uneven batch) the moving statistics become the
    global batch's; the layer's config round-trips; fused=True is refused as in Horovod."""
    n, r = n_r()
    xg, x, _ = global_batch((3,), seed=5)
    if len(x) == 0:  # fit needs a row: the rank that has none here takes one (every is what counts)
        x = xg[:1]
    every = hvdk.allgather(x)  # the global batch as the ranks hold it
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), hvd.SyncBatchNormalization(momentum=0.0), keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
                  run_eagerly=run_eagerly)
    model.fit(x, np.zeros((len(x), 1), np.float32), batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    bn = model.layers[0]
    np.testing.assert_allclose(bn.moving_mean.numpy(), every.mean(0), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(), every.var(0), rtol=1e-4)
    if n > 1:
        assert not np.allclose(bn.moving_mean.numpy(), x.mean(0))
    assert gathered_equal(model.weights)
    copy = hvd.SyncBatchNormalization.from_config(bn.get_config())
    assert isinstance(copy, hvd.SyncBatchNormalization) and copy.momentum == 0.0
    with pytest.raises(ValueError, match="fused"):
        hvd.SyncBatchNormalization(fused=True)


@pytest.mark.parametrize("mode", MODES)
def test_sync_batch_norm_with_a_mask(mode):
    """With a mask (one dimension less than the input), the moments are those of the unmasked
    values of every rank together, each rank counting its own: Keras 3's _moments and tf_keras's
    _calculate_mean_and_var both take it."""
    n, r = n_r()
    rng = np.random.RandomState(7)
    xg = rng.normal(1.0, 2.0, (2 * n, 4, 3)).astype(np.float32)
    mg = rng.rand(2 * n, 4) > 0.4
    mg[:, 0] = True
    x, m = xg[2 * r:2 * r + 2], mg[2 * r:2 * r + 2]
    layer = hvd.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    call(mode, lambda x, m: layer(x, training=True, mask=m), tf.constant(x), tf.constant(m))
    np.testing.assert_allclose(layer.moving_mean.numpy(), xg[mg].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.moving_variance.numpy(), xg[mg].var(0), rtol=1e-5)
    if n > 1:
        assert not np.allclose(layer.moving_mean.numpy(), x[m].mean(0))
    assert gathered_equal([layer.moving_mean, layer.moving_variance])


# ---- local (model-parallel) variables ----

def two_layer_model(r):
    """A Keras model whose weights depend on the rank, and a rank-dependent batch."""
    keras.utils.set_random_seed(10 + r)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    x, y = rank_data(r)
    return model, x, y


@pytest.mark.parametrize("scale", [True, False], ids=["scaled", "unscaled"])
@pytest.mark.parametrize("mode", MODES)
def test_partial_distributed_gradient_tape(mode, scale):
    """The local layer's gradients stay this rank's (divided by the size when scale_local_gradients,
    Horovod's default); the others are averaged."""
    n, r = n_r()
    model, x, y = two_layer_model(r)
    vs = model.trainable_variables
    with tf.GradientTape() as tape:
        lv = keras.losses.MeanSquaredError()(y, model(x))
    own = [g.numpy() for g in tape.gradient(lv, vs)]
    avg = [hvdk.allreduce(g) for g in own]

    def f():
        with tf.GradientTape() as t:
            lv = keras.losses.MeanSquaredError()(y, model(x))
        return hvd.PartialDistributedGradientTape(t, local_layers=model.layers[0],
                                                  scale_local_gradients=scale).gradient(lv, vs)
    got = call(mode, f)
    div = n if scale else 1
    for k in range(2):  # the first layer's kernel and bias: local
        np.testing.assert_allclose(got[k].numpy(), own[k] / div, rtol=1e-5, atol=1e-6)
    for k in range(2, 4):
        np.testing.assert_allclose(got[k].numpy(), avg[k], rtol=1e-5, atol=1e-6)
    if n > 1:
        assert not np.allclose(own[0], avg[0])
    with tf.GradientTape() as t:  # register_local_source on the plain tape, Horovod's other way
        lv = keras.losses.MeanSquaredError()(y, model(x))
    t = hvd.DistributedGradientTape(t)
    t.register_local_source(vs[3])
    got = t.gradient(lv, vs)
    np.testing.assert_allclose(got[3].numpy(), own[3] / n, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0].numpy(), avg[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="tf.keras.layers.Layer"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[vs[0]])


@pytest.mark.parametrize("passes,run_eagerly", [(1, False), (1, True), (2, False)],
                         ids=["graph", "eager", "aggregated"])
def test_partial_distributed_optimizer_in_fit(passes, run_eagerly):
    """With fit and SGD, the local layer moves by lr times this rank's gradient over the size, the
    others by lr times the ranks' average (with backward_passes_per_step=2 and averaging, two
    passes over the same batch make the same update)."""
    n, r = n_r()
    model, x, y = two_layer_model(r)
    with tf.GradientTape() as tape:
        lv = keras.losses.MeanSquaredError()(y, model(x))
    own = [g.numpy() for g in tape.gradient(lv, model.trainable_variables)]
    avg = [hvdk.allreduce(g) for g in own]
    w0 = [v.numpy() for v in model.trainable_variables]
    opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[model.layers[1]],
                                           backward_passes_per_step=passes, average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    model.fit(np.concatenate([x] * passes), np.concatenate([y] * passes), batch_size=len(x), epochs=1, verbose=0,
              shuffle=False)
    want = [w - 0.1 * g for w, g in zip(w0[:2], avg[:2])] + [w - 0.1 * g / n for w, g in zip(w0[2:], own[2:])]
    for v, w in zip(model.trainable_variables, want):
        np.testing.assert_allclose(v.numpy(), w, atol=1e-5)
    assert int(opt.iterations.numpy()) == passes


def test_broadcast_callback_keeps_local_variables():
    """local_variables stay each rank's own; every other variable becomes the root's."""
    n, r = n_r()
    root = n - 1
    model, x, y = two_layer_model(r)
    own = [v.numpy() for v in model.weights]
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    local = model.layers[0].weights
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=local)])
    every = [hvdk.allgather(v.numpy()[None]) for v in model.weights]
    for k, (v, e) in enumerate(zip(model.weights, every)):
        if k < 2:
            np.testing.assert_array_equal(v.numpy(), own[k])
        else:
            np.testing.assert_array_equal(v.numpy(), e[root])
    if n > 1:
        assert not np.array_equal(every[0][0], every[0][root])


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # Keras 3.15's save on NumPy 2
def test_best_model_checkpoint(tmp_path):
    """Saves on rank 0 only, when the monitored val_loss is the best so far."""
    n, r = n_r()
    where = hvd.broadcast_object(str(tmp_path), root_rank=0, name="best_ckpt_dir")
    scripted = [3.0, 1.0, 2.0, 0.5]

    class Script(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = scripted[epoch]
    cb = hvdk.callbacks.BestModelCheckpoint(save_weights_only=True)
    assert cb.monitor == "val_loss" and cb.save_best_only
    model, x, y = two_layer_model(0)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    with pytest.raises(ValueError, match="filepath"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[cb])
    cb.filepath = os.path.join(where, "r%d-{epoch}.weights.h5" % r)
    model.fit(x, y, epochs=4, verbose=0, callbacks=[Script(), cb])
    hvd.barrier()
    names = sorted(os.listdir(where))
    assert names == ["r0-1.weights.h5", "r0-2.weights.h5", "r0-4.weights.h5"], names
    hvd.barrier()  # every rank has looked before rank 0's tmp_path goes


# ---- the example (outside kolorun) ----

def pythonpath(first):
    """PYTHONPATH for a child: first, then the directories of ours other than the source tree's
    python/ (e.g. a --target directory with tf_keras for TF_USE_LEGACY_KERAS=1)."""
    ours = os.path.normpath(os.path.join(ROOT, "python"))
    rest = [os.path.abspath(d) for d in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if d and os.path.normpath(os.path.abspath(d)) != ours]
    return os.pathsep.join([first] + rest)


@pytest.mark.standalone
@pytest.mark.parametrize("how", ["fit", "custom-loop"])
def test_keras_example_learns(tmp_path, how):
    script = os.path.join(ROOT, "examples", "tensorflow", "keras_synthetic_digits.py")
    kolorun = os.path.join(ROOT, "build", "bin", "kolorun")
    ck = str(tmp_path / "model.keras")
    env = dict(os.environ, PYTHONPATH=pythonpath(os.path.join(ROOT, "python")))
    assert not UNDER_KOLORUN
    extra = ["--custom-loop"] if how == "custom-loop" else []
    p = subprocess.run([kolorun, "-np", "2", sys.executable, script, "--epochs", "2", "--threads", "1",
                        "--checkpoint", ck] + extra, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    epochs = re.findall(r"epoch (\d)/2 +loss ([\d.]+) .* val-acc ([\d.]+)", p.stdout)
    assert len(epochs) == 2, p.stdout  # printed by rank 0 only
    assert float(epochs[1][1]) < float(epochs[0][1])  # the loss falls
    assert re.search(r"RESULT workers=2 val_acc=0\.([3-9]|\d\d)\d* identical_weights=True", p.stdout), p.stdout
    assert os.path.exists(ck)


@pytest.mark.standalone
@pytest.mark.parametrize("seed", [31, 44], ids=["before-a-function", "in-a-thread"])
def test_a_rank_that_dies_in_the_mix_is_named_by_every_survivor(seed):
    """test_random_mix_a_rank_dies in a job of 3 ranks of its own: one of them dies in a step
    (seed 31: before its tf.function's call, while the others run theirs; seed 44: in one of its
    threads, before its operation, while other threads of it are in theirs), and the two others
    pass it."""
    kolorun = os.path.join(ROOT, "build", "bin", "kolorun")
    mix_ref.run_kill_job(kolorun, sys.executable, os.path.join(ROOT, "python", "tests", "test_tensorflow.py"), 3, seed,
                         60, dict(os.environ, PYTHONPATH=pythonpath(os.path.join(ROOT, "python"))))


@pytest.mark.standalone
def test_tensorflow_1_session_is_refused_not_hung():
    # Horovod's TensorFlow 1 style: eager execution off, ops built into the default graph
    code = ("import tensorflow as tf, kolo.tensorflow as hvd; hvd.init(); tf.compat.v1.disable_eager_execution()\n"
            "try:\n    hvd.allgather(tf.ones([4]))\nexcept NotImplementedError as e:\n    print('REFUSED', e)\n")
    env = dict(os.environ, PYTHONPATH=pythonpath(os.path.join(ROOT, "python")))
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert re.search(r"REFUSED kolo.tensorflow.allgather: TensorFlow 1 graphs", p.stdout), p.stdout


@pytest.mark.standalone
def test_pip_install_brings_the_tensorflow_modules(tmp_path):
    target = str(tmp_path / "site")
    pydir = os.path.join(ROOT, "python")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", target, pydir], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for d in os.listdir(pydir):  # setuptools' scratch trees
        if d == "build" or d.endswith(".egg-info"):
            shutil.rmtree(os.path.join(pydir, d), ignore_errors=True)
    assert p.returncode == 0, p.stdout
    env = dict(os.environ, PYTHONPATH=pythonpath(target), KOLO_LIBRARY=os.path.join(ROOT, "build", "lib", "libkolo.so"))
    code = ("import kolo.tensorflow as a, kolo.keras as b, kolo.tensorflow.keras as c, kolo.tensorflow.keras.callbacks;"
            "a.init(); print(a.__file__, c.DistributedOptimizer is b.DistributedOptimizer, a.allreduce([2.0]).numpy())")
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, cwd=target)
    assert p.returncode == 0, p.stdout
    assert target in p.stdout and p.stdout.strip().endswith("True [2.]"), p.stdout
