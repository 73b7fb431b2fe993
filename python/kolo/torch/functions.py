"""Helpers that keep every rank's model and optimizer identical (horovod/torch/functions.py):
broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object."""

import io
import pickle

import torch

from kolo.basics import global_process_set, rank
from kolo.torch.mpi_ops import allgather, broadcast_, broadcast_async_, synchronize

try:  # cloudpickle pickles lambdas and local classes as Horovod does; plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the machine
    _pickler = pickle


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts parameters from root_rank to every rank, in place.

    params: a dict (model.state_dict(); sorted by name) or a list of tensors or of
    (name, tensor) pairs (model.named_parameters()). Typical use, before training:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    try:
        for name, p in params:
            if not torch.is_tensor(p):
                continue  # e.g. extra state in a state_dict
            handles.append(broadcast_async_(p, root_rank, name, process_set=process_set))
    finally:
        for h in handles:
            synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Broadcasts an optimizer's state (its tensors in place, its options and scalar state by
    value) from root_rank, so every rank resumes from the same state. A fresh optimizer's
    state is first created by one step with zero gradients."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()

    if len(state_dict["state"]) == 0:
        # Newly created optimizers have no state yet: make it with a step on zero gradients.
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        # A DistributedOptimizer's step() would allreduce: take the wrapped class's step.
        if getattr(optimizer, "_kolo_distributed", False):
            super(optimizer.__class__, optimizer).step()
        else:
            optimizer.step()
        state_dict = optimizer.state_dict()

    # Options (lr, betas, momentum, ...) and non-tensor state travel as one pickled object;
    # state tensors are broadcast in place, in the optimizer's own state.
    pid_to_param = {}
    for g_sd, group in zip(state_dict["param_groups"], optimizer.param_groups):
        pid_to_param.update(zip(g_sd["params"], group["params"]))
    groups_opts = [{k: v for k, v in g.items() if k != "params"} for g in state_dict["param_groups"]]
    scalars = {}
    tensors = []
    for gi, g_sd in enumerate(state_dict["param_groups"]):
        for pid in g_sd["params"]:
            p = pid_to_param[pid]
            if p not in optimizer.state:
                continue
            pstate = optimizer.state[p]
            for key in sorted(pstate, key=str):
                value = pstate[key]
                if torch.is_tensor(value):
                    tensors.append(("%d.%s.%s" % (gi, pid, key), value))
                else:
                    scalars[(pid, key)] = value
    root_groups, root_scalars = broadcast_object((groups_opts, scalars), root_rank,
                                                 name="optimizer_state_options", process_set=process_set)
    broadcast_parameters(tensors, root_rank, process_set=process_set)
    for group, opts in zip(optimizer.param_groups, root_groups):
        group.update(opts)
    for (pid, key), value in root_scalars.items():
        p = pid_to_param.get(pid)
        if p is not None:
            optimizer.state[p][key] = value


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Pickles obj on root_rank and returns a copy of it on every rank."""
    if name is None:
        name = type(obj).__name__
    if rank() == root_rank:
        b = io.BytesIO()
        _pickler.dump(obj, b)
        t = torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8) if b.getbuffer().nbytes else \
            torch.empty(0, dtype=torch.uint8)
        sz = torch.tensor([t.numel()], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
    else:
        sz = torch.tensor([0], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
        t = torch.empty(int(sz.item()), dtype=torch.uint8)
    broadcast_(t, root_rank, name + ".t", process_set)
    if rank() != root_rank:
        obj = _pickler.loads(t.numpy().tobytes())
    return obj


def allgather_object(obj, name=None, process_set=global_process_set):
    """Pickles obj on every rank; returns the list of every rank's object, in rank order."""
    if name is None:
        name = type(obj).__name__
    data = _pickler.dumps(obj)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    sizes = allgather(torch.tensor([t.numel()], dtype=torch.int64), name=name + ".sz", process_set=process_set)
    gathered = allgather(t, name=name + ".t", process_set=process_set).numpy().tobytes()
    out, start = [], 0
    for s in sizes.tolist():
        out.append(_pickler.loads(gathered[start:start + s]))
        start += s
    return out
