"""DistributedOptimizer and the state helpers (multi-rank): overlap of communication with
backward, averaged gradients, identical models, optimizer state broadcast, Horovod's errors
and warnings, gradient accumulation, groups, compression."""

import copy
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kolo.torch as hvd  # noqa: E402
from kolo import _lib  # noqa: E402

import adasum_ref  # noqa: E402


def n_r():
    return hvd.size(), hvd.rank()


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def rank_batch(step=0):
    _, r = n_r()
    g = torch.Generator().manual_seed(1000 * r + step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def local_grads(model, step=0):
    """Gradients of this rank's batch, computed without kolo."""
    m = copy.deepcopy(model)
    for q in m.parameters():
        q.grad = None  # a copy's gradients start empty, whatever the model's hold
    x, y = rank_batch(step)
    F.cross_entropy(m(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]


def average_over_ranks(tensors):
    return [hvd.allreduce(t, op=hvd.Average) for t in tensors]


def gathered_equal(tensors):
    """True when every rank holds the same values."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors]).unsqueeze(0)
    allv = hvd.allgather(flat)
    return all(torch.equal(allv[0], allv[k]) for k in range(allv.shape[0]))


def averaged_step(model, **options):
    """One backward and step through a DistributedOptimizer: the gradients are the average of
    every rank's. Returns the optimizer."""
    expect = average_over_ranks(local_grads(model))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), **options)
    x, y = rank_batch()
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    for p, e in zip(model.parameters(), expect):
        assert torch.allclose(p.grad, e, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()
    return opt


def test_gradients_are_the_average_of_every_rank():
    averaged_step(make_model())


def grad_span(params):
    """Bytes from the start of the lowest gradient to the end of the highest, and their sum."""
    ext = sorted((p.grad.data_ptr(), p.grad.numel() * p.grad.element_size()) for p in params)
    return ext[-1][0] + ext[-1][1] - ext[0][0], sum(n for _, n in ext)


def test_gradients_move_into_one_shared_arena_and_stay():
    """Every rank runs on this host: the gradients live in one shared arena (64-byte aligned
    places), stay in the same places step after step, are zeroed there rather than set to None,
    and come back after model.zero_grad(set_to_none=True) made backward put them elsewhere."""
    model = make_model()
    ps = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    places = None
    for step in range(4):
        expect = average_over_ranks(local_grads(model, step))
        opt.zero_grad(set_to_none=True)
        if step == 2:
            model.zero_grad(set_to_none=True)
            assert all(p.grad is None for p in ps)
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        span, total = grad_span(ps)
        assert span <= total + 64 * len(ps), "the gradients are not in one arena"
        now = [p.grad.data_ptr() for p in ps]
        assert places is None or now == places
        places = now
        for p, e in zip(ps, expect):
            assert torch.allclose(p.grad, e, atol=1e-6)
        with opt.skip_synchronize():
            opt.step()
    assert gathered_equal(ps)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is not None and not p.grad.any() for p in ps)
    assert [p.grad.data_ptr() for p in ps] == places


def test_a_forked_child_leaves_the_parents_gradients_alone():
    """The arena is shared memory: a child forked from the rank (a DataLoader's worker, a pool
    with the fork start method) that zeroed or wrote the gradients (zero_grad, a backward pass,
    whose collectives it may not run but whose gradients autograd writes first) wrote the
    parent's, before the child got the arena as private memory (kolo_mem_alloc, fork_child)."""
    model = make_model()
    ps = list(model.parameters())
    opt = averaged_step(model)
    x, y = rank_batch(1)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    span, total = grad_span(ps)
    assert span <= total + 64 * len(ps), "the gradients are not in one arena"
    saved = [p.grad.clone() for p in ps]
    pid = os.fork()
    if pid == 0:  # the child's writes: none may reach the parent
        code = 3
        try:
            ok = all(torch.equal(p.grad, s) for p, s in zip(ps, saved))
            model.zero_grad(set_to_none=False)
            for p in ps:
                p.grad.add_(1.0)
            code = 0 if ok else 4
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert all(torch.equal(p.grad, s) for p, s in zip(ps, saved))
    with opt.skip_synchronize():
        opt.step()
    assert gathered_equal(ps)


def test_shared_gradients_can_be_turned_off(monkeypatch):
    model = make_model()
    opt = averaged_step(model, shared_gradients=False)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())  # torch's own behaviour
    monkeypatch.setenv("KOLO_TORCH_SHARED_GRADIENTS", "maybe")
    with pytest.raises(ValueError, match="KOLO_TORCH_SHARED_GRADIENTS"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())


def test_allreduces_start_while_backward_runs():
    """Overlap: gradients of the last layers are submitted, and even completed, while backward
    is still computing the first layer."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    seen = {}
    last_weight = model[4].weight

    def on_first_layer_output_grad(grad):
        # backward reaches the first layer's output: the last layer's gradient is final already
        handles = {p: h for p, (h, _) in opt._handles.items() if h is not None}
        seen["submitted"] = len(handles)
        seen["last_submitted"] = last_weight in handles
        if last_weight in handles:
            # every rank is here with the same submissions, so the engine completes them now,
            # while this backward is still running (no timing assumption: we wait for it)
            for _ in range(100000):
                if hvd.poll(handles[last_weight]):
                    seen["completed_during_backward"] = True
                    break
                torch.ones(1000).sum()  # let the engine thread run
        return grad

    x, y = rank_batch()
    h = model[0](x)
    h.register_hook(on_first_layer_output_grad)
    out = model[4](F.relu(model[2](F.relu(h))))
    F.cross_entropy(out, y).backward()
    opt.step()
    assert seen["submitted"] >= 4  # the last two layers' weights and biases
    assert seen["last_submitted"]
    assert seen.get("completed_during_backward")


def test_models_stay_identical_after_steps():
    n, r = n_r()
    model = make_model(seed=r)  # different on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert gathered_equal(list(model.parameters()))
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for step in range(4):
        opt.zero_grad()
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert gathered_equal(list(model.parameters()))
    assert not torch.equal(list(model.parameters())[0], make_model(seed=0)[0].weight)  # it trained


def test_training_matches_one_big_batch():
    """n ranks with batch b each take the same step as one process with the n*b batch."""
    n, r = n_r()
    model = make_model()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(2):
        batches = []
        for k in range(n):
            g = torch.Generator().manual_seed(1000 * k + step)
            batches.append((torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)))
        ref_opt.zero_grad()
        F.cross_entropy(reference(torch.cat([b[0] for b in batches])), torch.cat([b[1] for b in batches])).backward()
        ref_opt.step()
        opt.zero_grad()
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-5)


@pytest.mark.parametrize("kind", ["sgd_fresh", "adam_trained"])
def test_broadcast_optimizer_state(kind):
    n, r = n_r()
    model = make_model()
    if kind == "sgd_fresh":
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * (r + 1), momentum=0.5 + 0.1 * r)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.001 * (r + 1), betas=(0.9, 0.99 - 0.001 * r))
        for step in range(r + 1):  # a different history on every rank
            opt.zero_grad()
            x, y = rank_batch(step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 if kind == "sgd_fresh" else 0.001)
    if kind == "adam_trained":
        assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    state = opt.state_dict()["state"]
    tensors = [v for pid in sorted(state) for k, v in sorted(state[pid].items()) if torch.is_tensor(v)]
    assert tensors and gathered_equal(tensors)
    scalars = [float(v) for pid in sorted(state) for k, v in sorted(state[pid].items()) if not torch.is_tensor(v)]
    if scalars:
        assert gathered_equal([torch.tensor(scalars)])
    # and they keep training identically
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for step in range(2):
        dopt.zero_grad()
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
        dopt.step()
    assert gathered_equal(list(model.parameters()))


def test_broadcast_parameters_forms():
    n, r = n_r()
    a, b = torch.full((3,), float(r)), torch.full((2, 2), float(r + 10))
    hvd.broadcast_parameters({"b": b, "a": a}, root_rank=n - 1)
    assert a.tolist() == [n - 1.0] * 3 and b[0, 0].item() == n + 9
    c = torch.full((2,), float(r))
    hvd.broadcast_parameters([("c", c)], root_rank=0)
    d = torch.full((2,), float(r))
    hvd.broadcast_parameters([d], root_rank=0)
    assert c.tolist() == [0.0, 0.0] and d.tolist() == [0.0, 0.0]
    model = make_model(seed=r)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    assert gathered_equal(list(model.parameters()))
    with pytest.raises(ValueError):
        hvd.broadcast_parameters(42, root_rank=0)


def test_broadcast_and_allgather_objects():
    n, r = n_r()
    obj = {"rank": r, "list": [1, 2, r], "text": "x" * (r + 1)}
    assert hvd.broadcast_object(obj, root_rank=0) == {"rank": 0, "list": [1, 2, 0], "text": "x"}
    assert hvd.broadcast_object(obj if r == n - 1 else None, root_rank=n - 1, name="o2")["rank"] == n - 1
    everyone = hvd.allgather_object(obj)
    assert [o["rank"] for o in everyone] == list(range(n))
    assert [o["text"] for o in everyone] == ["x" * (k + 1) for k in range(n)]
    assert hvd.allgather_object(None, name="none") == [None] * n


# ---- Horovod's errors and warnings ----

def test_named_parameters_errors():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("same", p) for _, p in named])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named[:2])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, named_parameters=named, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(sgd, named_parameters=named, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(sgd, named_parameters=named, op=hvd.Adasum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("same", p) for _, p in named], op=hvd.Adasum)


def test_zero_grad_between_backward_and_step_is_refused():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = rank_batch()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()  # fine after step


def test_backward_passes_per_step_accumulates():
    model = make_model()
    g0, g1 = local_grads(model, 0), local_grads(model, 1)
    expect = average_over_ranks([a + b for a, b in zip(g0, g1)])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    for step in range(2):
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    for p, e in zip(model.parameters(), expect):
        assert torch.allclose(p.grad, e, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    # a third backward pass before step() is one too many
    for step in range(2):
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        x, y = rank_batch(2)
        F.cross_entropy(model(x), y).backward()
    opt.synchronize()


def test_one_backward_too_many_with_default_passes():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = rank_batch()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        F.cross_entropy(model(x), y).backward()
    opt.synchronize()


def test_step_after_synchronize_warns_unless_skipped():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = rank_batch()
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_parameter_without_gradient_on_some_ranks():
    """A branch taken on rank 0 only: the others send zeros for its gradient."""
    n, r = n_r()
    torch.manual_seed(0)
    trunk, branch = nn.Linear(4, 4), nn.Linear(4, 4)
    params = list(trunk.named_parameters(prefix="trunk")) + list(branch.named_parameters(prefix="branch"))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1), named_parameters=params)
    x = torch.ones(2, 4)
    # This rank's own gradient, from copies the optimizer does not hook: between backward and
    # synchronize p.grad is undefined (its allreduce may already have written the average in place,
    # when the other ranks' zeros came first).
    trunk_c, branch_c = copy.deepcopy(trunk), copy.deepcopy(branch)
    branch_c(trunk_c(x)).sum().backward()
    local = branch_c.weight.grad.clone() if r == 0 else torch.zeros(4, 4)
    out = trunk(x)
    if r == 0:
        out = branch(out)
    out.sum().backward()
    opt.synchronize()
    expect = hvd.allreduce(local, op=hvd.Sum) / n
    assert torch.allclose(branch.weight.grad, expect)
    with opt.skip_synchronize():
        opt.step()


@pytest.mark.parametrize("options", [
    dict(groups=2), dict(groups="list"), dict(num_groups=3), dict(gradient_predivide_factor=2.0),
    dict(compression="fp16"), dict(op="sum"), dict(unnamed=True)])
def test_optimizer_options(options):
    n, r = n_r()
    model = make_model()
    expect = average_over_ranks(local_grads(model))
    kw = dict(options)
    named = None if kw.pop("unnamed", False) else model.named_parameters()
    if kw.get("groups") == "list":
        kw["groups"] = [[model[0].weight, model[2].weight], [model[4].bias]]
    if kw.get("compression") == "fp16":
        kw["compression"] = hvd.Compression.fp16
    if kw.get("op") == "sum":
        kw["op"] = hvd.Sum
        expect = [e * n for e in expect]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # num_groups
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named, **kw)
    x, y = rank_batch()
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    tol = 2e-3 if options.get("compression") else 1e-5
    for p, e in zip(model.parameters(), expect):
        assert torch.allclose(p.grad, e, atol=tol, rtol=tol), options
    with opt.skip_synchronize():
        opt.step()


def test_load_state_dict_keeps_working():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    for step in range(2):
        opt.zero_grad()
        x, y = rank_batch(step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.load_state_dict(opt.state_dict())
    opt.zero_grad()
    x, y = rank_batch(5)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    assert gathered_equal(list(model.parameters()))


@pytest.mark.filterwarnings("error")  # PyTorch 2.x warns on sparse tensors built without check_invariants
@pytest.mark.parametrize("sparse_as_dense", [True, False])
def test_sparse_gradients(sparse_as_dense):
    n, r = n_r()
    torch.manual_seed(0)
    emb = nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(), sparse_as_dense=sparse_as_dense)
    emb(torch.tensor([r, 9])).sum().backward()  # row r on this rank, row 9 on every rank
    opt.synchronize()
    g = emb.weight.grad
    assert g.is_sparse != sparse_as_dense
    rows = g.to_dense().sum(1)
    expect = torch.zeros(10)
    expect[:n] = 3.0 / n
    expect[9] = 3.0
    assert torch.allclose(rows, expect)
    with opt.skip_synchronize():
        opt.step()


def test_sync_batch_norm_matches_one_big_batch():
    n, r = n_r()
    batches = [torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(k)) * (k + 1) + k for k in range(n)]
    torch.manual_seed(0)
    sbn = hvd.SyncBatchNorm(3, momentum=0.5)
    bn = nn.BatchNorm1d(3, momentum=0.5)
    with torch.no_grad():
        sbn.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        bn.weight.copy_(sbn.weight)
    x = batches[r].clone().requires_grad_(True)
    y = sbn(x)
    w = torch.arange(60, dtype=torch.float32).reshape(4, 3, 5)
    (y * w).sum().backward()
    xs = torch.cat(batches).requires_grad_(True)
    ref = bn(xs)
    (ref * w.repeat(n, 1, 1)).sum().backward()
    assert torch.allclose(y, ref[4 * r:4 * r + 4], atol=1e-4)
    assert torch.allclose(x.grad, xs.grad[4 * r:4 * r + 4], atol=1e-4)
    assert torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-5)
    assert torch.allclose(sbn.running_var, bn.running_var, atol=1e-4)
    # the affine parameters' gradients are per rank; DistributedOptimizer averages them
    assert torch.allclose(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad, atol=1e-3)
    sbn.eval()
    bn.eval()
    assert torch.allclose(sbn(batches[0]), bn(batches[0]), atol=1e-5)


# ---- op=Adasum: the delta optimizer ----

def adasum_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))


def adasum_batch(k, i):
    """Rank k's i-th batch."""
    g = torch.Generator().manual_seed(5000 + 100 * k + i)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def numpy_grads(params, x, y):
    """The gradients of mse(W2 tanh(W1 x + b1) + b2, y) by hand, in float64."""
    w1, b1, w2, b2 = params
    x, y = x.double().numpy(), y.double().numpy()
    h = np.tanh(x @ w1.T + b1)
    do = 2.0 * (h @ w2.T + b2 - y) / y.size
    dz = (do @ w2) * (1.0 - h * h)
    return [dz.T @ x, dz.sum(0), do.T @ h, do.sum(0)]


def numpy_delta_training(params, n, steps, lr, momentum=0.0, passes=1, fp16=False, combine=adasum_ref.adasum):
    """What the delta optimizer should do: every rank k steps SGD (with its own momentum buffers)
    on its own gradients, summed over `passes` batches, from the common parameters; the ranks'
    updates combine with Adasum, parameter by parameter; every rank adds the result."""
    params = [p.detach().double().numpy().copy() for p in params]
    bufs = [[None] * len(params) for _ in range(n)]
    for step in range(steps):
        deltas = []
        for k in range(n):
            grads = [sum(gs) for gs in zip(*[numpy_grads(params, *adasum_batch(k, step * passes + j))
                                              for j in range(passes)])]
            if momentum:
                bufs[k] = [g if b is None else momentum * b + g for b, g in zip(bufs[k], grads)]
                grads = bufs[k]
            deltas.append([-lr * g for g in grads])
        for i in range(len(params)):
            members = [deltas[k][i] for k in range(n)]
            if fp16:  # the deltas travel as float16
                members = [m.astype(np.float16).astype(np.float64) for m in members]
            params[i] = params[i] + combine(members)
    return params


@pytest.mark.parametrize("options", [dict(), dict(momentum=0.9), dict(passes=2), dict(fp16=True)])
def test_adasum_delta_optimizer_matches_numpy(options):
    n, r = n_r()
    model = adasum_model()
    lr, momentum, passes = 0.2, options.get("momentum", 0.0), options.get("passes", 1)
    expect = numpy_delta_training(list(model.parameters()), n, 3, lr, **options)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum), named_parameters=model.named_parameters(),
        op=hvd.Adasum, backward_passes_per_step=passes,
        compression=hvd.Compression.fp16 if options.get("fp16") else hvd.Compression.none)
    assert hasattr(opt, "_starts") == (n > 1)  # the delta optimizer (with one rank: the plain one)
    for step in range(3):
        opt.zero_grad()
        for j in range(passes):
            x, y = adasum_batch(r, step * passes + j)
            F.mse_loss(model(x), y).backward()
        opt.step()
    assert gathered_equal(list(model.parameters()))
    tol = 3e-4 if options.get("fp16") else 2e-6
    for p, e in zip(model.parameters(), expect):
        np.testing.assert_allclose(p.detach().double().numpy(), e, rtol=tol, atol=tol)
    # it trained, and otherwise than the average or the sum of the ranks' updates would have
    start = [p.detach().double().numpy() for p in adasum_model().parameters()]
    assert not np.allclose(expect[0], start[0], atol=1e-3)
    if n > 1:
        for other in (lambda ms: np.mean(ms, axis=0), lambda ms: np.sum(ms, axis=0)):
            trained = numpy_delta_training(list(adasum_model().parameters()), n, 3, lr, combine=other, **options)
            assert max(np.max(np.abs(a - b)) for a, b in zip(trained, expect)) > 30 * tol


def test_adasum_delta_optimizer_rules(tmp_path_factory):
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks: with one, DistributedOptimizer(op=Adasum) is the plain optimizer")
    model = adasum_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    with pytest.raises(AssertionError, match="Adasum"):
        with opt.skip_synchronize():
            pass
    base = os.path.join(str(tmp_path_factory.getbasetemp()), "adasum-timeline.json")
    hvd.start_timeline(base)
    x, y = adasum_batch(r, 0)
    F.mse_loss(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        F.mse_loss(model(x), y).backward()
    opt.synchronize()  # nothing to do: step() combines the deltas
    opt.step()
    hvd.stop_timeline()
    if _lib.HAVE_ENGINE:  # (the direct collectives have no names)
        # one request per parameter, named after it, as the gradient-averaging optimizer names its own
        with open(base if r == 0 else "%s.%d" % (base, r)) as f:
            text = f.read()
        for name, _ in model.named_parameters():
            assert "allreduce.%s" % name in text, name
    assert gathered_equal(list(model.parameters()))
    # step(closure) runs the closure first (its backward submits the deltas) and returns its loss
    opt.zero_grad()

    def closure():
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss
    assert isinstance(opt.step(closure), torch.Tensor)
    assert gathered_equal(list(model.parameters()))


def test_adasum_parameter_without_gradient_on_some_ranks():
    """A branch taken on rank 0 only: the others' deltas are zero, which Adasum leaves out, so
    every rank ends with rank 0's update."""
    n, r = n_r()
    if not _lib.HAVE_ENGINE:
        pytest.skip("the ranks submit in different orders, which only the engine's names match")
    torch.manual_seed(0)
    trunk, branch = nn.Linear(4, 4), nn.Linear(4, 4)
    params = list(trunk.named_parameters(prefix="trunk")) + list(branch.named_parameters(prefix="branch"))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1), named_parameters=params,
                                   op=hvd.Adasum)
    before = branch.weight.detach().clone()
    out = trunk(torch.ones(2, 4))
    if r == 0:
        out = branch(out)
    out.sum().backward()
    local = branch.weight.grad.clone() if r == 0 else torch.zeros(4, 4)
    opt.step()
    expect = hvd.broadcast(before - 0.1 * local, root_rank=0)
    assert torch.allclose(branch.weight, expect, atol=1e-6)
    assert gathered_equal([p for _, p in params])


def test_adasum_with_one_rank_is_the_plain_optimizer(monkeypatch):
    # Horovod's factory returns its usual DistributedOptimizer when size() == 1
    import kolo.torch.optimizer as kopt
    monkeypatch.setattr(kopt, "size", lambda: 1)
    model = adasum_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    assert not hasattr(opt, "_starts") and not opt._grad_accs  # no hooks: the wrapped step
    with opt.skip_synchronize():
        pass
