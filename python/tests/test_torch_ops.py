"""kolo.torch's collectives (multi-rank): every CPU dtype, in-place and async variants,
non-contiguous tensors, compression, autograd, process sets, join, errors; and all of them at once
in a random mix."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import kolo.torch as hvd  # noqa: E402

import adasum_ref  # noqa: E402
import mix_ref  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
if hasattr(torch, "uint16"):  # PyTorch >= 2.3
    DTYPES.append(torch.uint16)
# dtypes of newer PyTorch releases that kolo has no type for: refused, not sent as bytes
NEW_UNSUPPORTED = [getattr(torch, d) for d in ("uint32", "uint64", "float8_e4m3fn", "float8_e5m2") if hasattr(torch, d)]


def n_r():
    return hvd.size(), hvd.rank()


def ranked(dtype, shape=(3, 4)):
    _, r = n_r()
    base = (torch.arange(int(np.prod(shape))) % 6).reshape(shape)
    return (base * (r + 1)).to(dtype), base


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_dtype(dtype):
    n, r = n_r()
    x, base = ranked(dtype)
    out = hvd.allreduce(x, op=hvd.Sum)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, (base * (n * (n + 1) // 2)).to(dtype))
    assert torch.equal(hvd.allreduce(x, op=hvd.Min), base.to(dtype))
    assert torch.equal(hvd.allreduce(x, op=hvd.Max), (base * n).to(dtype))
    small = torch.full((4,), 1 + r % 2).to(dtype)
    prod = int(np.prod([1 + k % 2 for k in range(n)]))
    assert torch.equal(hvd.allreduce(small, op=hvd.Product), torch.full((4,), prod).to(dtype))
    avg = hvd.allreduce(torch.full((2,), 2 * (r + 1)).to(dtype))  # Average (default)
    s = n * (n + 1)
    if dtype.is_floating_point:
        assert torch.allclose(avg.double(), torch.full((2,), s / n, dtype=torch.float64), rtol=1e-2)
    else:
        assert torch.equal(avg, torch.full((2,), s // n).to(dtype))


def test_allreduce_bool():
    n, r = n_r()
    x = torch.tensor([True, r == 0, False])
    assert hvd.allreduce(x, op=hvd.Sum).tolist() == [True, True, False]
    assert hvd.allreduce(x, op=hvd.Min).tolist() == [True, n == 1, False]


def test_allreduce_variants():
    n, r = n_r()
    x = torch.full((3,), float(r))
    expect = torch.full((3,), n * (n - 1) / 2)
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum), expect) and x[0].item() == r
    h = hvd.allreduce_async(x, op=hvd.Sum, name="t_async")
    assert torch.equal(hvd.synchronize(h), expect)
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Sum) is y and torch.equal(y, expect)
    y = x.clone()
    h = hvd.allreduce_async_(y, op=hvd.Sum)
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h) is y and torch.equal(y, expect)
    assert hvd.synchronize(h) is None  # an unknown handle, as in Horovod


def test_average_keyword_is_deprecated_but_works():
    n, r = n_r()
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(torch.full((2,), float(r + 1)), average=False)
    assert out.tolist() == [n * (n + 1) / 2] * 2
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def test_scale_factors():
    n, r = n_r()
    out = hvd.allreduce(torch.full((4,), float(r + 1), dtype=torch.float64), op=hvd.Sum, prescale_factor=0.5,
                        postscale_factor=4.0)
    assert torch.allclose(out, torch.full((4,), 2.0 * n * (n + 1) / 2, dtype=torch.float64))


def test_non_contiguous_in_and_out_of_place():
    n, r = n_r()
    m = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (r + 1)
    t = m.t()  # transposed: not contiguous
    assert not t.is_contiguous()
    expect = torch.arange(24, dtype=torch.float32).reshape(4, 6).t() * n * (n + 1) / 2
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), expect)
    hvd.allreduce_(t, op=hvd.Sum)
    assert torch.equal(m.t(), expect)  # written back through the view
    b = torch.full((4, 6), float(r))[:, ::3]
    hvd.broadcast_(b, root_rank=0)
    assert torch.equal(b, torch.zeros(4, 2))


def test_compression_fp16():
    n, r = n_r()
    x = torch.full((5,), float(r + 1), dtype=torch.float64)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float64 and out.tolist() == [n * (n + 1) / 2] * 5
    ints = torch.full((3,), r + 1, dtype=torch.int32)
    c, ctx = hvd.Compression.fp16.compress(ints)
    assert c is ints and hvd.Compression.fp16.decompress(c, ctx) is ints
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float64
    t, ctx = hvd.Compression.none.compress(x)
    assert t is x and hvd.Compression.none.decompress(t, ctx) is x


def test_unsupported_tensors():
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    for dtype in NEW_UNSUPPORTED:
        with pytest.raises(ValueError, match="not supported"):
            hvd.allreduce(torch.zeros(2, dtype=dtype))
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.ones(2).to_sparse())
    with pytest.raises(ValueError, match="CPU tensors only; got a tensor on meta"):
        hvd.allreduce_async_(torch.empty(2, device="meta"))
    with pytest.raises(TypeError, match="expected a torch.Tensor, got list"):
        hvd.allreduce_async_([1.0, 2.0])


def test_grouped_allreduce():
    n, r = n_r()
    ts = [torch.full((3,), float(r + 1)), torch.full((2, 2), r, dtype=torch.int64),
          torch.full((4,), float(r), dtype=torch.bfloat16)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="t_group")
    assert outs[0].tolist() == [n * (n + 1) / 2] * 3
    assert outs[1].tolist() == [[n * (n - 1) // 2] * 2] * 2 and outs[1].dtype == torch.int64
    assert outs[2].float().tolist() == [n * (n - 1) / 2] * 4
    h = hvd.grouped_allreduce_async(ts, op=hvd.Max)
    assert [o[0].item() if o.dim() == 1 else o[0, 0].item() for o in hvd.synchronize(h)] == [n, n - 1, n - 1]
    hvd.grouped_allreduce_(ts, op=hvd.Sum)
    assert ts[0].tolist() == [n * (n + 1) / 2] * 3
    h = hvd.grouped_allreduce_async_(ts, op=hvd.Min)
    assert hvd.synchronize(h)[0] is ts[0]


def test_allgather_and_grouped():
    n, r = n_r()
    x = torch.full((r + 1, 2), r, dtype=torch.int8)
    expect = torch.cat([torch.full((k + 1, 2), k, dtype=torch.int8) for k in range(n)])
    assert torch.equal(hvd.allgather(x), expect)
    assert torch.equal(hvd.synchronize(hvd.allgather_async(x)), expect)
    outs = hvd.grouped_allgather([x, torch.tensor([r], dtype=torch.bool)])
    assert torch.equal(outs[0], expect) and outs[1].tolist() == [k % 2 == 1 or k == 0 and False for k in range(n)] \
        or outs[1].tolist() == [bool(k) for k in range(n)]


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
def test_broadcast_every_dtype(dtype):
    n, r = n_r()
    root = n - 1
    x = torch.full((2, 3), r + 1).to(dtype)
    out = hvd.broadcast(x, root_rank=root)
    assert torch.equal(out, torch.full((2, 3), root + 1).to(dtype)) and torch.equal(x, torch.full((2, 3), r + 1).to(dtype))
    h = hvd.broadcast_async_(x, root_rank=0)
    assert hvd.synchronize(h) is x and torch.equal(x, torch.full((2, 3), 1).to(dtype))
    y = torch.full((2,), r + 5).to(dtype)
    assert torch.equal(hvd.synchronize(hvd.broadcast_async(y, 0)), torch.full((2,), 5).to(dtype))
    assert hvd.broadcast_(y, 0) is y


def test_alltoall():
    n, r = n_r()
    x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    out = hvd.alltoall(x)
    assert torch.is_tensor(out)
    expect = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * k for k in range(n)])
    assert torch.equal(out, expect)
    splits = torch.tensor([k + 1 for k in range(n)], dtype=torch.int32)
    rows = torch.cat([torch.tensor([[r, k]] * (k + 1)) for k in range(n)])
    out, received = hvd.alltoall(rows, splits=splits)
    assert received.dtype == torch.int32 and received.tolist() == [r + 1] * n
    assert torch.equal(out, torch.cat([torch.tensor([[k, r]] * (r + 1)) for k in range(n)]))
    out2, rec2 = hvd.synchronize(hvd.alltoall_async(rows, splits=[k + 1 for k in range(n)]))
    assert torch.equal(out2, out) and torch.equal(rec2, received)


def test_reducescatter():
    n, r = n_r()
    rows = 2 * n + 1
    x = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (r + 1)
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    full = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * n * (n + 1) / 2
    assert torch.equal(hvd.reducescatter(x, op=hvd.Sum), full[start:start + counts[r]])
    assert torch.allclose(hvd.reducescatter(x), full[start:start + counts[r]] / n)  # Average by default
    assert torch.equal(hvd.synchronize(hvd.reducescatter_async(x, op=hvd.Sum)), full[start:start + counts[r]])
    outs = hvd.grouped_reducescatter([x, torch.ones(n, 3, dtype=torch.float64)], op=hvd.Sum)
    assert torch.equal(outs[0], full[start:start + counts[r]]) and outs[1].tolist() == [[float(n)] * 3]
    with pytest.raises(ValueError, match="scalar"):
        hvd.reducescatter(torch.tensor(1.0))


# ---- autograd ----

def test_allreduce_grad():
    n, r = n_r()
    for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
        x = torch.ones(3, requires_grad=True)
        y = hvd.allreduce(x * (r + 1), op=op)
        y.sum().backward()
        # dy/dx on this rank is (r + 1) times the allreduced gradient of ones
        assert x.grad.tolist() == [float(factor * (r + 1))] * 3


def test_grouped_allreduce_grad():
    n, r = n_r()
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a * 2, b * 3], op=hvd.Sum)
    (ya.sum() + yb.sum()).backward()
    assert a.grad.tolist() == [2.0 * n] * 2 and b.grad.tolist() == [3.0 * n] * 3


@pytest.mark.filterwarnings("error")  # no deprecation warning from kolo's own backward
def test_allgather_grad():
    n, r = n_r()
    x = torch.full((r + 1, 2), 1.0, requires_grad=True)
    y = hvd.allgather(x)
    # each rank weighs the gathered rows by their owner's rank + 1
    w = torch.cat([torch.full((k + 1, 2), float(k + 1)) for k in range(n)])
    (y * w).sum().backward()
    # Horovod: the gradient is the average over ranks of the output gradient, sliced
    assert x.grad.tolist() == [[float(r + 1)] * 2] * (r + 1)


@pytest.mark.filterwarnings("error")  # no deprecation warning from kolo's own backward
def test_broadcast_grad():
    n, r = n_r()
    x = torch.full((3,), float(r), requires_grad=True)
    y = hvd.broadcast(x, root_rank=0)
    (y * 2).sum().backward()
    assert x.grad.tolist() == ([2.0] * 3 if r == 0 else [0.0] * 3)


def test_alltoall_grad():
    n, r = n_r()
    splits = [k + 1 for k in range(n)]
    x = torch.ones(sum(splits), 2, requires_grad=True)
    y, received = hvd.alltoall(x, splits=splits)
    # weight the rows received from rank k by k + 1: the gradient goes back to rank k's rows
    w = torch.cat([torch.full((int(received[k]), 2), float(k + 1)) for k in range(n)])
    (y * w).sum().backward()
    assert x.grad.tolist() == [[float(r + 1)] * 2] * sum(splits)


def test_reducescatter_grad():
    n, r = n_r()
    x = torch.ones(2 * n, 3, requires_grad=True)
    y = hvd.reducescatter(x, op=hvd.Sum)
    (y * (r + 1)).sum().backward()
    # row block k of every rank's x fed rank k's output with weight 1
    expect = torch.cat([torch.full((2, 3), float(k + 1)) for k in range(n)])
    assert torch.equal(x.grad, expect)
    x.grad = None
    y = hvd.reducescatter(x, op=hvd.Average)
    y.sum().backward()
    assert torch.allclose(x.grad, torch.full((2 * n, 3), 1.0 / n))


# ---- process sets, join, barrier ----

def test_process_set_ops():
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    members = [0, n - 1] if n > 2 else [1]  # the whole world would duplicate the global set
    ps = hvd.add_process_set(members)
    m = len(members)
    try:
        if ps.included():
            # Named: unnamed operations are numbered per process, and only some ranks issue these.
            out = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="ps", process_set=ps)
            assert out.item() == sum(members)
            g = hvd.allgather(torch.tensor([r]), name="ps", process_set=ps)
            assert g.tolist() == members
            b = hvd.broadcast(torch.tensor([r]), root_rank=n - 1, name="ps", process_set=ps)
            assert b.item() == n - 1
            a = hvd.alltoall(torch.tensor([r] * m), name="ps", process_set=ps)
            assert a.tolist() == members
            rs = hvd.reducescatter(torch.ones(m, 1), op=hvd.Sum, name="ps", process_set=ps)
            assert rs.tolist() == [[float(m)]]
            # (a barrier on this set is tested in test_jobs.py: it leaves the members' unnamed
            # barrier counter ahead of the others')
        else:
            with pytest.raises(ValueError):
                hvd.allreduce(torch.ones(1), name="ps_not_member", process_set=ps)
    finally:
        hvd.remove_process_set(ps)


def test_join_uneven_batches():
    n, r = n_r()
    w = torch.ones(3)
    for i in range(1 + r):  # rank r has r + 1 batches
        out = hvd.allreduce(w, op=hvd.Sum, name="t_join")
        assert out.tolist() == [float(n - i)] * 3  # ranks with fewer batches contribute zeros
    last = hvd.join()
    assert last == n - 1
    # after every rank joined, the job goes on normally
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n


def test_join_then_allgather_fails_on_every_rank():
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    if r == 0:
        last = hvd.join()
    else:
        with pytest.raises(hvd.HorovodInternalError, match="(?i)join"):
            hvd.allgather(torch.ones(1), name="t_join_gather")
        last = hvd.join()
    assert last in range(1, n)  # rank 0 joined first; which other rank came last is a race
    assert hvd.allgather_object(last, name="t_join_last") == [last] * n  # but all agree


def test_barrier():
    hvd.barrier()
    hvd.barrier(process_set=hvd.global_process_set)


# ---- errors ----

def test_duplicate_name_raises_value_error_at_once():
    # A name is taken until its request completes, which happens as soon as the last rank has
    # submitted it: a rank that checks right after its own submission may already find the name
    # free again. So rank 0 submits and checks while the others wait at a barrier.
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    err = None
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), name="t_dup")
        try:
            hvd.allreduce_async_(torch.ones(2), name="t_dup")
        except ValueError as e:
            err = e
    hvd.barrier()
    if r != 0:
        h = hvd.allreduce_async(torch.ones(2), name="t_dup")
    assert hvd.synchronize(h).tolist() == [1.0, 1.0]
    if r == 0:
        assert err is not None and "t_dup" in str(err), "a second in-flight 't_dup' was not refused"


def test_mismatch_raises_on_every_rank():
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(hvd.HorovodInternalError, match="t_mm_shape"):
        hvd.allreduce(torch.ones(r + 1), name="t_mm_shape")
    with pytest.raises(RuntimeError, match="t_mm_op"):
        hvd.allreduce(torch.ones(2), name="t_mm_op", op=hvd.Sum if r == 0 else hvd.Max)
    with pytest.raises(RuntimeError, match="t_mm_dtype"):
        hvd.allreduce(torch.ones(2, dtype=torch.float32 if r else torch.float64), name="t_mm_dtype")
    with pytest.raises(RuntimeError, match="t_mm_scale"):
        hvd.allreduce(torch.ones(2), name="t_mm_scale", prescale_factor=1.0 + r)
    h = hvd.broadcast_async(torch.ones(2), root_rank=r, name="t_mm_root")
    with pytest.raises(hvd.HorovodInternalError):
        hvd.synchronize(h)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n


def test_unnamed_ops_are_numbered_in_order():
    n, r = n_r()
    hs = [hvd.allreduce_async(torch.full((2,), float(i)), op=hvd.Sum) for i in range(5)]
    outs = [hvd.synchronize(h) for h in hs]
    assert [o[0].item() for o in outs] == [float(i * n) for i in range(5)]


# ---- Adasum (the arithmetic is checked against adasum_ref.py in test_numpy.py) ----

ADASUM_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def member_tensors(n, shape, seed, dtype):
    """Every rank's tensor, as torch tensors of dtype, and the same values in float64 NumPy."""
    ts = [torch.tensor(v).to(dtype) for v in adasum_ref.member_vectors(n, shape, seed)]
    return ts, [t.double().numpy().copy() for t in ts]


def assert_adasum(out, vs, dtype):
    ref = adasum_ref.adasum(vs)
    assert out.dtype == dtype and tuple(out.shape) == ref.shape
    np.testing.assert_allclose(out.double().numpy(), ref, **adasum_ref.tolerance(dtype, ref))


@pytest.mark.parametrize("dtype", ADASUM_DTYPES)
def test_adasum_every_allreduce_variant(dtype):
    n, r = n_r()
    ts, vs = member_tensors(n, (3, 5), 1, dtype)
    x = ts[r]
    assert_adasum(hvd.allreduce(x, op=hvd.Adasum), vs, dtype)
    assert torch.equal(x, ts[r])  # input untouched
    assert_adasum(hvd.synchronize(hvd.allreduce_async(x, op=hvd.Adasum, name="t_adasum")), vs, dtype)
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Adasum) is y
    assert_adasum(y, vs, dtype)
    y = x.clone()
    assert hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Adasum)) is y
    assert_adasum(y, vs, dtype)
    z = x.clone().t()  # non-contiguous: travels as a copy, the result is copied back
    hvd.allreduce_(z, op=hvd.Adasum)
    assert_adasum(z, [v.T for v in vs], dtype)
    # grouped: each tensor is its own Adasum vector
    us, ws = member_tensors(n, (4,), 2, dtype)
    group_refs = [vs, ws]
    for outs in (hvd.grouped_allreduce([x, us[r]], op=hvd.Adasum),
                 hvd.synchronize(hvd.grouped_allreduce_async([x, us[r]], op=hvd.Adasum, name="t_adasum_g"))):
        for o, members in zip(outs, group_refs):
            assert_adasum(o, members, dtype)
    pair = [x.clone(), us[r].clone()]
    hvd.grouped_allreduce_(pair, op=hvd.Adasum)
    for o, members in zip(pair, group_refs):
        assert_adasum(o, members, dtype)
    pair = [x.clone(), us[r].clone()]
    assert hvd.synchronize(hvd.grouped_allreduce_async_(pair, op=hvd.Adasum))[1] is pair[1]
    for o, members in zip(pair, group_refs):
        assert_adasum(o, members, dtype)
    # fp16 compression: the tensor travels as float16 and comes back in its own dtype
    if dtype == torch.float64:
        out = hvd.allreduce(x, op=hvd.Adasum, compression=hvd.Compression.fp16)
        half = [v.astype(np.float16).astype(np.float64) for v in vs]
        assert out.dtype == torch.float64
        np.testing.assert_allclose(out.numpy(), adasum_ref.adasum(half),
                                   **adasum_ref.tolerance(np.float16, adasum_ref.adasum(half)))


def test_adasum_results_are_the_same_bits_on_every_rank():
    n, r = n_r()
    for dtype in ADASUM_DTYPES:
        ts, _ = member_tensors(n, (257,), 3, dtype)
        out = hvd.allreduce(ts[r], op=hvd.Adasum)
        raw = out.view(torch.int16 if out.element_size() == 2 else torch.int32 if out.element_size() == 4
                       else torch.int64)
        allv = hvd.allgather(raw.unsqueeze(0))
        assert all(torch.equal(allv[0], allv[k]) for k in range(n)), dtype


def test_adasum_grad():
    # as in Horovod: the gradient of an allreduce is the allreduce of the gradient, same op
    n, r = n_r()
    _, gs = member_tensors(n, (4,), 4, torch.float64)
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    hvd.allreduce(x, op=hvd.Adasum).backward(torch.from_numpy(gs[r]))
    np.testing.assert_allclose(x.grad.numpy(), adasum_ref.adasum(gs), rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_adasum_of_integers_is_refused(dtype):
    name = str(dtype).replace("torch.", "")
    with pytest.raises(ValueError, match="(?i)adasum.*%s" % name):
        hvd.allreduce(torch.ones(3, dtype=dtype), op=hvd.Adasum)
    with pytest.raises(ValueError, match="(?i)adasum"):
        hvd.allreduce_async_(torch.ones(3, dtype=dtype), op=hvd.Adasum)
    with pytest.raises(ValueError, match="(?i)adasum"):
        hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=dtype)], op=hvd.Adasum)
    with pytest.raises(ValueError, match="(?i)adasum"):
        hvd.reducescatter(torch.ones(4, 2), op=hvd.Adasum)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()  # the job goes on


def test_large_outputs_reuse_kept_blocks():
    # out-of-place outputs of 32 MiB and more are tensors over blocks kept from call to call
    # (kolo._pool): PyTorch's allocator hands such blocks back to the kernel, and the next call's
    # fresh pages fault in again (2 ranks: a 64 MB allreduce 51-64 ms against 13-15)
    from kolo import _pool
    n, r = n_r()
    x = torch.arange(_pool.MALLOC_KEEPS // 4, dtype=torch.float32)
    a = hvd.allreduce(x, name="pool.ar", op=hvd.Max)
    addr = a.data_ptr()
    assert torch.equal(a, x)
    del a
    b = hvd.allreduce(x, name="pool.ar", op=hvd.Max)
    assert b.data_ptr() == addr and torch.equal(b, x)
    c = hvd.allreduce(x, name="pool.ar2", op=hvd.Max)  # b is still out: another block
    assert c.data_ptr() != addr and torch.equal(b, c)
    del b, c
    for dt in (torch.bfloat16, torch.bool, torch.float16):  # types NumPy lacks or spells otherwise
        y = torch.ones(_pool.MALLOC_KEEPS // torch.empty(0, dtype=dt).element_size(), dtype=dt)
        out = hvd.broadcast(y, 0, name="pool.bc.%s" % dt)
        assert out.dtype == dt and out.shape == y.shape and torch.equal(out, y)
        del out
    # an output the engine allocated (1 MiB and more) is returned as it is, over the engine's block,
    # which serves the next output of its size once the tensor goes
    rows = (1 << 20) // 16 // n + 1
    g = hvd.allgather(torch.full((rows, 4), float(r)), name="pool.ag")
    addr = g.data_ptr()
    assert g.shape == (n * rows, 4) and all(g[i * rows, 0].item() == i for i in range(n)) and addr % 64 == 0
    g.add_(1)  # an output is the caller's to change
    del g
    g = hvd.allgather(torch.full((rows, 4), float(r)), name="pool.ag")
    assert g.data_ptr() == addr and all(g[i * rows, 0].item() == i for i in range(n))
    h = hvd.alltoall(torch.full((n * (1 << 16),), float(r), dtype=torch.bfloat16), name="pool.a2a")
    assert h.dtype == torch.bfloat16 and all(h[i << 16].item() == i for i in range(n))
    small = hvd.allreduce(torch.ones(1000), name="pool.small")
    with torch.no_grad():
        small.resize_(5000)  # a plain tensor below the size


# ---- everything at once ----

MIX_DTYPES = {str(d).replace("torch.", ""): d for d in DTYPES}


def _mix_tensor(q, t, r, rows):
    arr = mix_ref.values(q, t, r, rows * q["width"]).reshape(rows, q["width"])
    dtype = MIX_DTYPES[q["dtype"]]
    if q["noncontig"] and rows >= 2 and q["width"] >= 2:
        return torch.tensor(arr.T).to(dtype).t()  # a transposed view: not contiguous
    return torch.tensor(arr).to(dtype)


def _mix_submit(q, r, name, ps):
    """Starts request q on rank r; returns (handle, the in-place tensors or None). An out-of-place
    input is dropped on return (reference counting frees it at once, and the next request's
    tensors may take its memory): the binding must hold it until the operation is done."""
    w, kw = q["width"], {"process_set": ps}
    if q["kind"] == "ar":
        x = _mix_tensor(q, 0, r, q["rows"])
        return hvd.allreduce_async(x, name=name, op=q["op"], prescale_factor=q["pre"],
                                   postscale_factor=q["post"], **kw), None
    if q["kind"] == "ar_":
        x = _mix_tensor(q, 0, r, q["rows"])
        return hvd.allreduce_async_(x, name=name, op=q["op"], prescale_factor=q["pre"],
                                    postscale_factor=q["post"], **kw), [x]
    if q["kind"] == "grp":
        xs = [_mix_tensor(q, t, r, q["rows"]) for t in range(q["ntensors"])]
        return hvd.grouped_allreduce_async(xs, name=name, op=q["op"], prescale_factor=q["pre"],
                                           postscale_factor=q["post"], **kw), None
    if q["kind"] == "ag":
        return hvd.allgather_async(_mix_tensor(q, 0, r, mix_ref.ag_rows(q, 0, r)), name=name, **kw), None
    if q["kind"] == "gag":
        xs = [_mix_tensor(q, t, r, mix_ref.ag_rows(q, t, r)) for t in range(q["ntensors"])]
        return hvd.grouped_allgather_async(xs, name=name, **kw), None
    if q["kind"] == "grs":
        xs = [_mix_tensor(q, t, r, q["rows"]) for t in range(q["ntensors"])]
        return hvd.grouped_reducescatter_async(xs, name=name, op=q["op"], **kw), None
    if q["kind"] in ("bc", "bc_"):
        dtype = MIX_DTYPES[q["dtype"]]
        x = _mix_tensor(q, 0, r, q["rows"]) if r == q["root"] else torch.full((q["rows"], w), 99).to(dtype)
        if q["kind"] == "bc_":
            return hvd.broadcast_async_(x, q["root"], name=name, **kw), [x]
        return hvd.broadcast_async(x, q["root"], name=name, **kw), None
    if q["kind"] == "a2a":
        splits = mix_ref.a2a_splits(q, r)
        x = torch.cat([_mix_tensor(q, d, r, mix_ref.a2a_rows(q, r, d)).reshape(-1, w) for d in q["members"]])
        return hvd.alltoall_async(x, splits=splits, name=name, **kw), None
    return hvd.reducescatter_async(_mix_tensor(q, 0, r, q["rows"]), name=name, op=q["op"], **kw), None


def _mix_check(q, got, want, what):
    assert got.dtype == MIX_DTYPES[q["dtype"]], "%s: dtype %s, want %s" % (what, got.dtype, q["dtype"])
    mix_ref.check(q, got.double().numpy(), want, what)


def test_random_mix_of_async_ops_in_each_ranks_order():
    """Every async operation at once, as a training step issues them: allreduces in and out of
    place and grouped (Adasum too), allgathers with rows per rank, alone and grouped, broadcasts in
    and out of place, alltoalls with splits, reducescatters alone and grouped; every dtype and op, scale factors, non-contiguous inputs, a
    quarter on a process set beside the world under the same names, names reused with new kinds
    and shapes every step. Each rank submits in its own order, dropping its out-of-place inputs at
    once (the binding must hold them), polls some, and waits in another order; every element is
    checked, and some outputs are kept for later steps and checked again after every step (an
    output's memory must not serve another while the tensor lives: kolo._pool)."""
    assert _mix(120).heard == []


@pytest.mark.skipif(not os.environ.get("KT_MIX_KILL"), reason="a rank dies: test_jobs.py runs it in a job of its own")
def test_random_mix_a_rank_dies():
    """The mix above, where one rank leaves without a word at a point of a step (mix_ref.fate):
    every survivor hears of it, each of its operations either completes with the right values or
    raises HorovodInternalError naming the rank that died (never a timeout, never another rank),
    and so does what it submits after."""
    fate = _mix(120, kill=True)
    said = fate.survived(hvd.rank())
    with pytest.raises(hvd.HorovodInternalError, match="rank %d\\b" % fate.victim):
        hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="after.the.death"))
    print(said)


def _mix(steps, kill=False):
    """Runs the mix for steps; with kill, one rank dies (mix_ref.fate). Returns the mix_ref.Fate,
    with the errors this rank's operations ended with, each checked to name the victim."""
    n, r = n_r()
    seed, plan, ps_members = mix_ref.start(n)
    fate = mix_ref.Fate(seed, n, steps, kill)
    ps = hvd.add_process_set(ps_members) if ps_members else None
    kept = []

    def die_at(waits, k):
        if step == fate.step and r == fate.victim and mix_ref.kill_point(fate.point, len(order)) == (waits, k):
            os._exit(0)  # no shutdown, no goodbye: as a crash
    try:
        for step in range(steps):
            mine = mix_ref.rank_rng(seed, r, step)
            reqs = [mix_ref.plan_one(plan, n, ps_members, list(MIX_DTYPES)) for _ in range(plan.randint(1, 8))]
            order = list(range(len(reqs)))
            mine.shuffle(order)
            live = {}
            for k, j in enumerate(order):
                die_at(False, k)
                q = reqs[j]
                if r not in q["members"]:
                    continue
                qps = ps if q["members"] is ps_members else hvd.global_process_set
                try:
                    live[j] = _mix_submit(q, r, "mix.%d" % j, qps)
                except hvd.HorovodInternalError as e:
                    fate.lost(e, "step %d, submitting %s 'mix.%d'" % (step, q["kind"], j))
            mine.shuffle(order)
            for k, j in enumerate(order):
                die_at(True, k)
                if j not in live:
                    continue
                q, (h, inplace) = reqs[j], live[j]
                what = "step %d, %s '%s'" % (step, q["kind"], "mix.%d" % j)
                if mine.random() < 0.3:
                    hvd.poll(h)
                try:
                    out = hvd.synchronize(h)
                except hvd.HorovodInternalError as e:
                    fate.lost(e, what)
                    continue
                want = mix_ref.expect(q, r)
                if q["kind"] == "a2a":
                    (out, splits), (want, want_splits) = out, want
                    assert splits.tolist() == want_splits, "%s: splits %s, want %s" % (what, splits.tolist(),
                                                                                      want_splits)
                outs = out if isinstance(out, list) else [out]
                assert len(outs) == len(want), what
                for t, (o, wnt) in enumerate(zip(outs, want)):
                    _mix_check(q, o, wnt, what)
                    if inplace is not None:
                        assert o is inplace[t] or o.data_ptr() == inplace[t].data_ptr(), what + ": not in place"
                    if q["keep"]:
                        kept.append((q, o, wnt, what + " (kept)"))
            for q, o, wnt, what in kept:  # nothing reused an output that is still alive
                _mix_check(q, o, wnt, what)
            mine.shuffle(kept)
            del kept[12:]
            if fate.heard:  # the victim died: this step's operations have all ended
                break
    finally:
        if ps is not None and fate.victim < 0:  # (after a death, the engine has stopped)
            hvd.barrier()
            hvd.remove_process_set(ps)
    return fate
