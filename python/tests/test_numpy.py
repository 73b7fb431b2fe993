"""kolo's collectives on NumPy arrays (multi-rank): every dtype and op, scaling, in-place and
async variants, grouped operations, uneven shapes, join, barrier, errors."""

import os

import numpy as np
import pytest

import kolo

import adasum_ref

DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


def n_r():
    return kolo.size(), kolo.rank()


def rank_values(dtype, shape=(3, 4)):
    """rank r holds (r + 1) * base, base = 0..5 repeating: small enough for int8 products."""
    _, r = n_r()
    base = (np.arange(int(np.prod(shape))) % 6).reshape(shape)
    return (base * (r + 1)).astype(dtype), base


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_every_dtype(dtype):
    n, _ = n_r()
    x, base = rank_values(dtype)
    out = kolo.allreduce(x, op=kolo.Sum)
    assert out.dtype == x.dtype and out.shape == x.shape
    expect = (base * (n * (n + 1) // 2)).astype(dtype)
    np.testing.assert_array_equal(out, expect)
    np.testing.assert_array_equal(x, rank_values(dtype)[0])  # input untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_min_max_product(dtype):
    n, _ = n_r()
    x, base = rank_values(dtype, (7,))
    np.testing.assert_array_equal(kolo.allreduce(x, op=kolo.Min), base.astype(dtype))
    np.testing.assert_array_equal(kolo.allreduce(x, op=kolo.Max), (base * n).astype(dtype))
    small = np.full(5, 1 + kolo.rank() % 2, dtype)  # 1 or 2: products stay in range
    prod = np.prod([1 + r % 2 for r in range(n)])
    np.testing.assert_array_equal(kolo.allreduce(small, op=kolo.Product), np.full(5, prod, dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64, np.float16])
def test_allreduce_average_is_sum_over_size(dtype):
    n, r = n_r()
    x = np.array([r + 1, 10 * (r + 1), 7], dtype)
    out = kolo.allreduce(x)  # default op: Average
    s = np.array([n * (n + 1) / 2, 10 * n * (n + 1) / 2, 7 * n])
    if np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(out, np.trunc(s / n).astype(dtype))  # integers truncate
    else:
        np.testing.assert_allclose(out, (s / n).astype(dtype), rtol=1e-3)


def test_allreduce_bool_is_logical():
    n, r = n_r()
    x = np.array([True, r == 0, False])
    np.testing.assert_array_equal(kolo.allreduce(x, op=kolo.Sum), [True, True, False])   # OR
    np.testing.assert_array_equal(kolo.allreduce(x, op=kolo.Min), [True, n == 1, False])  # AND
    np.testing.assert_array_equal(kolo.allreduce(x, op=kolo.Max), [True, True, False])


def test_prescale_postscale():
    n, r = n_r()
    x = np.full(4, r + 1, np.float64)
    out = kolo.allreduce(x, op=kolo.Sum, prescale_factor=2.0, postscale_factor=0.5)
    np.testing.assert_allclose(out, np.full(4, n * (n + 1) / 2))
    out = kolo.allreduce(x, op=kolo.Average, postscale_factor=3.0)
    np.testing.assert_allclose(out, np.full(4, 3.0 * (n + 1) / 2))
    xi = np.full(3, 3, np.int32)
    np.testing.assert_array_equal(kolo.allreduce(xi, op=kolo.Sum, prescale_factor=0.5), np.full(3, n, np.int32))


def test_allreduce_in_place_and_async():
    n, r = n_r()
    x = np.full(5, r, np.float32)
    same = kolo.allreduce_(x, op=kolo.Sum)
    assert same is x
    np.testing.assert_array_equal(x, np.full(5, n * (n - 1) / 2))
    a = np.full(3, 1.0, np.float32)
    h = kolo.allreduce_async(a, op=kolo.Sum, name="np_async")
    out = kolo.synchronize(h)
    assert kolo.synchronize(h) is None  # consumed
    np.testing.assert_array_equal(out, np.full(3, n))
    b = np.full(3, 2.0)
    h = kolo.allreduce_async_(b, op=kolo.Sum)
    while not kolo.poll(h):
        pass
    assert kolo.synchronize(h) is b and b.tolist() == [2.0 * n] * 3


def test_allreduce_non_contiguous():
    n, r = n_r()
    m = np.arange(24, dtype=np.float64).reshape(4, 6) * (r + 1)
    view = m[:, ::2]
    assert not view.flags.c_contiguous
    out = kolo.allreduce(view, op=kolo.Sum)
    np.testing.assert_array_equal(out, np.arange(24).reshape(4, 6)[:, ::2] * n * (n + 1) / 2)
    kolo.allreduce_(view, op=kolo.Sum)  # copied back into the strided view
    np.testing.assert_array_equal(m[:, ::2], out)
    np.testing.assert_array_equal(m[:, 1::2], np.arange(24).reshape(4, 6)[:, 1::2] * (r + 1))


def test_one_step_of_many_shapes(monkeypatch):
    """Submissions share the C structs of the shapes and process sets they have seen; a step
    mixing shapes (past the cache's cap too), byte-order spellings and the two names of the
    world must still give every array its own result."""
    from kolo import _ops
    monkeypatch.setattr(_ops, "_SHAPES", {})
    monkeypatch.setattr(_ops, "_SHAPES_MAX", 3)
    n, r = n_r()
    shapes = [(2, 3), (5,), (2, 3), (), (1, 1, 4), (7,), (5,), (3, 2), (2, 3)]
    arrays, handles = [], []
    for i, shape in enumerate(shapes):
        dt = np.dtype("<f4") if i % 2 else np.float32
        a = np.array((np.arange(int(np.prod(shape))).reshape(shape) + i) * (r + 1), dtype=dt)
        ps = kolo.global_process_set if i % 3 == 0 else None
        arrays.append(a)
        handles.append(kolo.allreduce_async_(a, op=kolo.Sum, name="many_shapes.%d" % i, process_set=ps))
    for h in handles:
        kolo.synchronize(h)
    for i, (shape, a) in enumerate(zip(shapes, arrays)):
        assert a.shape == shape
        want = (np.arange(int(np.prod(shape))).reshape(shape) + i) * n * (n + 1) / 2
        np.testing.assert_array_equal(a, want)
    assert len(_ops._SHAPES) == 3


def test_allreduce_scalar_and_empty():
    n, r = n_r()
    assert kolo.allreduce(np.array(r + 1.0), op=kolo.Sum).tolist() == n * (n + 1) / 2
    e = kolo.allreduce(np.zeros((0, 3), np.float32), op=kolo.Sum)
    assert e.shape == (0, 3)


def test_read_only_array_in_place_is_refused():
    x = np.ones(3)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kolo.allreduce_(x)


def test_unsupported_dtype():
    with pytest.raises(ValueError, match="not supported"):
        kolo.allreduce(np.ones(2, np.complex64))


def test_grouped_allreduce():
    n, r = n_r()
    arrays = [np.full(3, r + 1, np.float32), np.full((2, 2), r, np.float64), np.full(4, 2, np.int32)]
    outs = kolo.grouped_allreduce(arrays, op=kolo.Sum, name="np_group")
    assert [o.dtype for o in outs] == [a.dtype for a in arrays]
    np.testing.assert_array_equal(outs[0], np.full(3, n * (n + 1) / 2))
    np.testing.assert_array_equal(outs[1], np.full((2, 2), n * (n - 1) / 2))
    np.testing.assert_array_equal(outs[2], np.full(4, 2 * n))
    kolo.grouped_allreduce_(arrays, op=kolo.Max)
    assert arrays[0].tolist() == [n] * 3 and arrays[2].tolist() == [2] * 4


def test_allgather_uneven_first_dimension():
    n, r = n_r()
    x = np.full((r + 1, 2), r, np.int16)
    out = kolo.allgather(x)
    expect = np.concatenate([np.full((k + 1, 2), k, np.int16) for k in range(n)])
    np.testing.assert_array_equal(out, expect)
    outs = kolo.grouped_allgather([x, np.full((1,), r, np.float32)], name="np_gag")
    np.testing.assert_array_equal(outs[0], expect)
    np.testing.assert_array_equal(outs[1], np.arange(n, dtype=np.float32))


def test_allgather_scalar_is_refused():
    with pytest.raises(ValueError):
        kolo.allgather(np.array(1.0))


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_broadcast_every_root(dtype):
    n, r = n_r()
    for root in range(n):
        x = np.full((2, 3), r % 2 if dtype is np.bool_ else r + 1, dtype)
        out = kolo.broadcast(x, root_rank=root)
        np.testing.assert_array_equal(out, np.full((2, 3), root % 2 if dtype is np.bool_ else root + 1, dtype))
        kolo.broadcast_(x, root_rank=root)
        np.testing.assert_array_equal(x, out)


def test_alltoall_even_and_with_splits():
    n, r = n_r()
    x = np.arange(2 * n, dtype=np.float32) + 100 * r  # 2 rows for each rank
    out = kolo.alltoall(x)
    expect = np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * k for k in range(n)]).astype(np.float32)
    np.testing.assert_array_equal(out, expect)
    # rank r sends k+1 rows of [r, k] to rank k
    splits = [k + 1 for k in range(n)]
    rows = np.concatenate([np.tile([r, k], (k + 1, 1)) for k in range(n)]).astype(np.int64)
    out, received = kolo.alltoall(rows, splits=splits)
    assert received.tolist() == [r + 1] * n
    np.testing.assert_array_equal(out, np.concatenate([np.tile([k, r], (r + 1, 1)) for k in range(n)]))


def test_alltoall_bad_splits():
    n, _ = n_r()
    with pytest.raises(ValueError):
        kolo.alltoall(np.zeros(n * 2), splits=[1] * (n + 1))
    with pytest.raises(ValueError):
        kolo.alltoall(np.zeros(n * 2), splits=[5] * n)


@pytest.mark.parametrize("rows", [None, 1, 5])
def test_reducescatter(rows):
    n, r = n_r()
    rows = rows or 2 * n
    x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (r + 1)
    out = kolo.reducescatter(x, op=kolo.Sum)
    # rows / n each, one more for the first rows % n ranks
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    full = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * n * (n + 1) / 2
    np.testing.assert_array_equal(out, full[start:start + counts[r]])
    avg = kolo.reducescatter(x)  # Average
    np.testing.assert_allclose(avg, full[start:start + counts[r]] / n)


def test_grouped_reducescatter():
    n, r = n_r()
    outs = kolo.grouped_reducescatter([np.ones((n, 2), np.float32), np.ones((2 * n,), np.int32)], op=kolo.Sum)
    np.testing.assert_array_equal(outs[0], np.full((1, 2), n))
    np.testing.assert_array_equal(outs[1], np.full((2,), n))


def test_reducescatter_scalar_is_refused():
    with pytest.raises(ValueError, match="scalar"):
        kolo.reducescatter(np.array(1.0))


def test_barrier():
    for _ in range(3):
        kolo.barrier()


def test_join_uneven_batches():
    n, r = n_r()
    steps = 2 + r  # the last rank has the most batches
    for i in range(steps):
        out = kolo.allreduce(np.ones(4, np.float32), op=kolo.Sum, name="np_join")
        still = sum(1 for k in range(n) if k + 2 > i)  # ranks that have batch i
        np.testing.assert_array_equal(out, np.full(4, still))  # joined ranks add zeros
    assert kolo.join() == n - 1


def test_duplicate_name_in_flight():
    # The request completes (freeing the name) once the last rank submits it, so rank 0 checks
    # while the others wait at a barrier (see test_torch_ops.py's twin).
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    x = np.ones(2, np.float32)
    err = None
    if r == 0:
        h = kolo.allreduce_async(x, name="np_dup")
        try:
            kolo.allreduce_async(x, name="np_dup")
        except ValueError as e:
            err = e
    kolo.barrier()
    if r != 0:
        h = kolo.allreduce_async(x, name="np_dup")
    kolo.synchronize(h)
    if r == 0:
        assert err is not None and "np_dup" in str(err), "a second in-flight 'np_dup' was not refused"
    kolo.synchronize(kolo.allreduce_async(x, name="np_dup"))  # free again once complete


def test_mismatch_fails_on_every_rank():
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(kolo.HorovodInternalError, match="np_mismatch") as e:
        kolo.allreduce(np.ones(2 + r, np.float32), name="np_mismatch")
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(RuntimeError, match="(?i)type"):
        kolo.allreduce(np.ones(2, np.float32 if r == 0 else np.float64), name="np_mismatch_dtype")
    with pytest.raises(RuntimeError):
        kolo.broadcast(np.ones(2, np.float32), root_rank=r, name="np_mismatch_root")
    # the job goes on
    assert kolo.allreduce(np.ones(1), op=kolo.Sum, name="np_after_mismatch").tolist() == [n]


def test_shared_empty_array_reduces_in_place_exactly():
    # 16 MiB + 3 floats: the size from which every rank reads the others' arrays directly
    n, r = n_r()
    count = (16 << 20) // 4 + 3
    a = kolo.shared_empty(count, np.float32)
    assert a.shape == (count,) and a.dtype == np.float32 and not a.any()
    base = np.arange(count, dtype=np.int64) % 1000
    a[:] = (base + r).astype(np.float32)
    kolo.allreduce_(a, op=kolo.Sum, name="shared.sum")
    assert np.array_equal(a, (base * n + n * (n - 1) // 2).astype(np.float32))
    b = kolo.shared_empty((2, 3), np.int32)
    assert b.shape == (2, 3) and b.dtype == np.int32
    with pytest.raises(MemoryError, match="shared_empty"):
        kolo.shared_empty(1 << 62, np.uint8)
    with pytest.raises(ValueError, match="negative dimension"):
        kolo.shared_empty((2, -1), np.float32)
    # a forked child (a DataLoader's worker) reads the array and writes its own copy of it
    pid = os.fork()
    if pid == 0:
        ok = np.array_equal(a, (base * n + n * (n - 1) // 2).astype(np.float32))
        a[:] = -1
        os._exit(0 if ok else 3)
    assert os.waitpid(pid, 0)[1] == 0
    assert np.array_equal(a, (base * n + n * (n - 1) // 2).astype(np.float32))


# ---- Adasum (the reference: adasum_ref.py) ----

def same_bits_everywhere(a, process_set=None):
    """True when every rank (of the set) holds exactly the same bytes."""
    raw = np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8)
    rows = kolo.allgather(raw.reshape(1, -1), process_set=process_set or kolo.global_process_set)
    return all(np.array_equal(rows[0], rows[k]) for k in range(rows.shape[0]))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (5, 7), (1001,), (40001,)])  # the last above KOLO_SMALL_ALLREDUCE_MAX
def test_adasum_is_the_tree_of_pairs(dtype, shape):
    n, r = n_r()
    vs = adasum_ref.member_vectors(n, shape, seed=len(shape) + shape[0], dtype=dtype)
    out = kolo.allreduce(vs[r], op=kolo.Adasum, name="adasum.tree")
    assert out.dtype == dtype and out.shape == shape
    ref = adasum_ref.adasum(vs)
    np.testing.assert_allclose(out.astype(np.float64), ref, **adasum_ref.tolerance(dtype, ref))
    assert same_bits_everywhere(out)
    # what this compares with is particular: neither the sum nor the mean, and (3 members and
    # more) another order of combination gives another result
    if n > 1 and shape[0] > 1:
        total = np.sum(vs, axis=0, dtype=np.float64)
        assert not np.allclose(ref, total, rtol=1e-3) and not np.allclose(ref, total / n, rtol=1e-3)
    if n > 2 and shape[0] > 1:
        assert not np.allclose(ref, adasum_ref.adasum(vs[1:] + vs[:1]), rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_adasum_orthogonal_vectors_add_and_equal_ones_stay(dtype):
    n, r = n_r()
    # rank k's vector lives in its own block of coordinates: a . b = 0 at every pair
    blocks = np.zeros((n, 3), dtype)
    blocks[r] = [r + 1, -2 * (r + 1), 0.5]
    out = kolo.allreduce(blocks.reshape(-1), op=kolo.Adasum)
    expect = np.array([[k + 1, -2 * (k + 1), 0.5] for k in range(n)], dtype).reshape(-1)
    np.testing.assert_array_equal(out, expect)  # the sum, exactly
    v = np.linspace(-3, 5, 11).astype(dtype)
    np.testing.assert_array_equal(kolo.allreduce(v, op=kolo.Adasum), v)  # (v + v) / 2 at every pair
    # parallel vectors of different lengths: two of them give their average
    w = kolo.allreduce(v * (r + 1), op=kolo.Adasum)
    ref = adasum_ref.adasum([v * (k + 1) for k in range(n)])
    np.testing.assert_allclose(w, ref, **adasum_ref.tolerance(dtype, ref))
    if n == 2:
        np.testing.assert_allclose(w, 1.5 * v.astype(np.float64), **adasum_ref.tolerance(dtype, ref))


def test_adasum_zero_vector_is_neutral():
    n, r = n_r()
    vs = adasum_ref.member_vectors(n, (9,), seed=7, dtype=np.float32)
    vs[0][:] = 0  # rank 0 has nothing to contribute
    out = kolo.allreduce(vs[r], op=kolo.Adasum)
    ref = adasum_ref.adasum(vs)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, **adasum_ref.tolerance(np.float32, ref))
    if n in (2, 3):  # rank 0 pairs with rank 1 first, which then goes on as if alone
        np.testing.assert_allclose(ref, adasum_ref.adasum(vs[1:]), rtol=1e-12)
    zeros = kolo.allreduce(np.zeros(4, np.float64), op=kolo.Adasum)  # nothing anywhere: zeros, no NaN
    np.testing.assert_array_equal(zeros, np.zeros(4))
    assert kolo.allreduce(np.zeros((0, 3), np.float32), op=kolo.Adasum).shape == (0, 3)


def test_adasum_scale_factors():
    n, r = n_r()
    vs = adasum_ref.member_vectors(n, (6,), seed=11)
    out = kolo.allreduce(vs[r], op=kolo.Adasum, prescale_factor=2.0, postscale_factor=0.25)
    ref = adasum_ref.adasum(vs, prescale=2.0, postscale=0.25)
    np.testing.assert_allclose(out, ref, **adasum_ref.tolerance(np.float64, ref))
    # (Adasum is scale-equivariant: a prescale s only multiplies the result by s)
    out = kolo.allreduce_(vs[r].copy(), op=kolo.Adasum, postscale_factor=3.0)
    ref = 3.0 * adasum_ref.adasum(vs)
    np.testing.assert_allclose(out, ref, **adasum_ref.tolerance(np.float64, ref))


def test_adasum_of_several_tensors_takes_each_as_its_own_vector():
    """A grouped allreduce (one fused collective in the engine) and separate requests fused by
    the engine: every tensor is combined on its own, not as a slice of one long vector."""
    n, r = n_r()
    from kolo import _lib
    shapes = [(4, 3), (1,), (17,), (9000,)]  # 72 KiB in all: above KOLO_SMALL_ALLREDUCE_MAX
    # very different scales and directions per tensor: one long vector would weigh them otherwise
    per = [adasum_ref.member_vectors(n, s, seed=20 + i) for i, s in enumerate(shapes)]
    for i, scale in enumerate([1e3, 1.0, 1e-3, 0.1]):
        per[i] = [v * scale for v in per[i]]
    refs = [adasum_ref.adasum(vs) for vs in per]
    whole = adasum_ref.adasum([np.concatenate([per[i][k].reshape(-1) for i in range(len(shapes))])
                               for k in range(n)])
    mine = [vs[r] for vs in per]
    before = kolo.engine_stats()
    outs = kolo.grouped_allreduce(mine, op=kolo.Adasum, name="adasum.group")
    after = kolo.engine_stats()
    if _lib.HAVE_ENGINE:
        assert after["fused_collectives"] > before["fused_collectives"]
    arrays = [m.copy() for m in mine]
    handles = [kolo.allreduce_async_(a, op=kolo.Adasum, name="adasum.fused.%d" % i) for i, a in enumerate(arrays)]
    for h in handles:
        kolo.synchronize(h)
    for got in (outs, arrays):
        for o, ref in zip(got, refs):
            np.testing.assert_allclose(o, ref, **adasum_ref.tolerance(np.float64, ref))
        flat = np.concatenate([o.reshape(-1) for o in got])
        if n > 1:
            assert not np.allclose(flat, whole, rtol=1e-3, atol=1e-6), "combined as one vector"
        assert same_bits_everywhere(flat)


def test_adasum_on_a_process_set():
    """Any number of members (here every rank but 0: 1 with 2 ranks, 2 with 3, 3 with 4)."""
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    ps = kolo.add_process_set(list(range(1, n)))
    try:
        vs = adasum_ref.member_vectors(n - 1, (10,), seed=31)
        if ps.included():
            out = kolo.allreduce(vs[ps.rank()], op=kolo.Adasum, name="adasum.set", process_set=ps)
            ref = adasum_ref.adasum(vs)
            np.testing.assert_allclose(out, ref, **adasum_ref.tolerance(np.float64, ref))
            assert same_bits_everywhere(out, ps)
    finally:
        kolo.remove_process_set(ps)


def test_adasum_with_joined_ranks_leaves_them_out():
    # a joined rank takes part with zeros, which Adasum leaves out (docs/engine.md, Join)
    from kolo import _lib
    if not _lib.HAVE_ENGINE:
        pytest.skip("join() needs the engine")
    n, r = n_r()
    vs = adasum_ref.member_vectors(n, (6,), seed=41)
    for i in range(1 + r):  # rank r has 1 + r batches
        out = kolo.allreduce(vs[r] * (i + 1), op=kolo.Adasum, name="adasum.join")
        ref = adasum_ref.adasum([v * (i + 1) if k >= i else np.zeros(6) for k, v in enumerate(vs)])
        np.testing.assert_allclose(out, ref, **adasum_ref.tolerance(np.float64, ref))
    assert kolo.join() == n - 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8, np.bool_])
def test_adasum_refuses_other_than_floating_point(dtype):
    with pytest.raises(ValueError, match="(?i)adasum.*%s" % np.dtype(dtype).name):
        kolo.allreduce(np.ones(3, dtype), op=kolo.Adasum)
    with pytest.raises(ValueError, match="(?i)adasum"):
        kolo.grouped_allreduce([np.ones(2, np.float32), np.ones(3, dtype)], op=kolo.Adasum)
    with pytest.raises(ValueError, match="(?i)adasum.*allreduce only"):
        kolo.reducescatter(np.ones((4, 2), np.float32), op=kolo.Adasum)
    # the job goes on
    assert kolo.allreduce(np.ones(1), op=kolo.Sum).tolist() == [kolo.size()]


def test_output_pool_keeps_aligned_blocks_up_to_the_peak():
    # kolo._pool: the frameworks' outputs (kolo.tensorflow) come from kept blocks
    from kolo._pool import ALIGN, BufferPool
    p = BufferPool()
    a = p.empty((1000, 100), np.float32)  # 400 KB
    assert a.shape == (1000, 100) and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % ALIGN == 0
    a[...] = 3
    addr = a.ctypes.data
    assert p.stats() == {"idle_bytes": 0, "out_bytes": 400000, "peak_bytes": 400000}
    del a
    assert p.stats() == {"idle_bytes": 400000, "out_bytes": 0, "peak_bytes": 400000}
    b = p.empty((100000,), np.int32)  # the same bytes in another shape and dtype: the same block
    assert b.ctypes.data == addr
    v = b[10:20]  # a view that outlives the array keeps the block out
    del b
    assert p.stats()["out_bytes"] == 400000
    del v
    xs = [p.empty((100000,), ">f4") for _ in range(3)]  # three out at once: the peak is 1.2 MB
    assert len({x.ctypes.data for x in xs}) == 3 and xs[0].dtype == np.dtype(">f4")
    del xs
    assert p.stats() == {"idle_bytes": 1200000, "out_bytes": 0, "peak_bytes": 1200000}
    c = p.empty((200000,), np.float32)  # another size (800 KB): a new block
    c_addr = c.ctypes.data
    del c  # kept; the blocks idle longest go to stay within the peak
    assert p.stats() == {"idle_bytes": 1200000, "out_bytes": 0, "peak_bytes": 1200000}
    assert [len(p._free[k]) for k in (400000, 800000)] == [1, 1]
    c = p.empty((200000,), np.float32)
    assert c.ctypes.data == c_addr
    del c
    small = p.empty((3, 5), np.float64)  # small outputs are aligned but not kept
    assert small.ctypes.data % ALIGN == 0 and small.shape == (3, 5) and p.stats()["out_bytes"] == 0
    empty = p.empty((0, 4), np.int8)
    assert empty.shape == (0, 4)
    p.clear()
    assert p.stats()["idle_bytes"] == 0


def test_output_pool_forgets_a_peak_after_two_windows():
    # the cap on idle blocks is the most out at once in this window or the one before (60 s): three
    # blocks out at once in the first steps go once two windows passed with one out at a time
    from kolo._pool import BufferPool
    now = [0.0]
    p = BufferPool(window_s=10, clock=lambda: now[0])
    xs = [p.empty((100000,), np.float32) for _ in range(3)]
    del xs
    assert p.stats()["idle_bytes"] == 1200000
    for t in range(1, 30):  # a step every second, one 800 KB output each
        now[0] = float(t)
        c = p.empty((200000,), np.float32)
        del c
        idle = p.stats()["idle_bytes"]
        # until t=20 this window or the one before saw the three out (1.2 MB): one of them stays
        # beside the step's block; then only the step's block
        assert idle == (1200000 if t < 20 else 800000), (t, idle)
    addr = p.empty((200000,), np.float32).ctypes.data  # (freed at once: the next call gets it again)
    assert p.empty((200000,), np.float32).ctypes.data == addr
    now[0] = 100.0  # a pause of many windows with nothing out: the cap is what the next call holds
    d = p.empty((100000,), np.float32)
    assert p.stats() == {"idle_bytes": 0, "out_bytes": 400000, "peak_bytes": 400000}
    del d
    assert p.stats()["idle_bytes"] == 400000


def test_large_outputs_reuse_kept_blocks():
    # outputs of 32 MiB and more come from blocks kept from call to call (kolo._pool: the allocator
    # hands such blocks back to the kernel, and fresh pages fault at every call); smaller ones from NumPy
    import kolo._pool as pool
    x = np.arange(pool.MALLOC_KEEPS // 4, dtype=np.float32)
    a = kolo.allreduce(x, name="pool.ar", op=kolo.Max)
    addr = a.ctypes.data
    assert addr % pool.ALIGN == 0 and np.array_equal(a, x) and not a.flags.owndata
    del a
    b = kolo.allreduce(x, name="pool.ar", op=kolo.Max)
    assert b.ctypes.data == addr and np.array_equal(b, x)
    c = kolo.broadcast(x + 1, 0, name="pool.bc")  # b is still out: another block
    assert c.ctypes.data != addr and np.array_equal(c, x + 1) and np.array_equal(b, x)
    del b, c
    # an output the engine allocated (1 MiB and more) is returned as it is, over the engine's block,
    # which serves the next output of its size once the array goes
    g = kolo.allgather(x[: x.size // 2], name="pool.ag")
    addr = g.ctypes.data
    assert addr % pool.ALIGN == 0 and np.array_equal(g, np.tile(x[: x.size // 2], kolo.size()))
    g[:3] = -1  # the caller's to change
    v = g[5:9]
    del g
    assert v.tolist() == x[5:9].tolist()  # a view keeps the block
    del v
    g = kolo.allgather(x[: x.size // 2] + 1, name="pool.ag")
    assert g.ctypes.data == addr and np.array_equal(g, np.tile(x[: x.size // 2] + 1, kolo.size()))
    del g
    rs = kolo.reducescatter(np.ones((4 * kolo.size(), 1 << 16), np.float32), name="pool.rs", op=kolo.Sum)
    assert rs.shape == (4, 1 << 16) and (rs == kolo.size()).all() and rs.ctypes.data % pool.ALIGN == 0
    assert kolo.allreduce(np.ones(1000), name="pool.small").flags.owndata  # NumPy's own
