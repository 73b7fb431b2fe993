"""kolo's collectives on NumPy arrays (multi-rank): every dtype and op, scaling, in-place and
async variants, grouped operations, uneven shapes, join, barrier, errors."""

import numpy as np
import pytest

import kolo

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
