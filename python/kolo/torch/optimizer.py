"""DistributedOptimizer: wraps a torch optimizer so that every gradient is averaged over the
ranks, each one as soon as backward has produced it (horovod/torch/optimizer.py).

How: a hook on each parameter's gradient accumulator (the AccumulateGrad node reached through
p.expand_as(p).grad_fn.next_functions[0][0], as Horovod does) submits an in-place
allreduce_async_ of that gradient the moment it is final, named after the parameter. The
engine negotiates and fuses these while backward computes the earlier layers. step() waits
for all of them (synchronize()) and then runs the wrapped optimizer's step.

Shared gradients: when every rank runs on this host, the CPU parameters' gradients move into one
kolo_mem_alloc arena per dtype (kolo.shared_empty), so that a fused bucket of more than 64 KiB is
read and written by the other ranks directly, mapped, instead of being copied through shared-memory rings
(docs/python.md). The hook moves a dense gradient into its place the first time it sees it (one
copy; a sparse one stays where it is and its place is given up). Backward accumulates into a
gradient that exists in place, so the gradients stay there; zero_grad() zeroes them in place
instead of setting them to None, and one that backward put elsewhere all the same (after
model.zero_grad(set_to_none=True)) is moved back by the hook before its allreduce.

op=Adasum (with more than one rank) selects another class, _DistributedAdasumOptimizer, Horovod's
"delta optimizer": what travels is each parameter's update, not its gradient (see that class).
"""

import os
import warnings
from contextlib import contextmanager

import numpy as np
import torch

import kolo
from kolo.basics import Average, Adasum, _elastic, global_process_set, local_size, size
from kolo.torch.compression import Compression
from kolo.torch.mpi_ops import (allreduce_async_, grouped_allreduce_async_, sparse_allreduce_async,
                                synchronize)
from kolo.torch.functions import broadcast_object


# dtypes whose gradients may live in the shared arena
_ARENA_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _shared_gradients_wanted(shared_gradients, compression):
    """The shared_gradients argument; None: KOLO_TORCH_SHARED_GRADIENTS, else on when every rank
    runs on this host and gradients travel as they are."""
    if shared_gradients is None:
        env = os.environ.get("KOLO_TORCH_SHARED_GRADIENTS", "").strip().lower()
        if env in ("0", "false", "no", "off"):
            return False
        if env not in ("", "1", "true", "yes", "on"):
            raise ValueError("KOLO_TORCH_SHARED_GRADIENTS=%r: want 0 or 1" % env)
        shared_gradients = True if env else None
    if shared_gradients is None:
        return size() > 1 and local_size() == size() and compression is Compression.none
    return bool(shared_gradients)


def _split_list(items, n):
    """n nearly equal consecutive parts."""
    k, m = divmod(len(items), n)
    return [items[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]


def _name_parameters(param_groups, named_parameters):
    """{parameter: name} for every parameter of the groups, after Horovod's checks: named_parameters
    holds (name, tensor) pairs with unique names covering every parameter; None names them
    allreduce.noname.<group>.<index>. Sorted by name."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%s.%s" % (i, j), v)
                            for i, param_group in enumerate(param_groups)
                            for j, v in enumerate(param_group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                         "produced by model.named_parameters().")

    dups = _DistributedOptimizer.find_duplicates([k for k, _ in named_parameters])
    if len(dups) > 0:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s"
                         % ", ".join(sorted(dups)))

    all_param_ids = {id(v) for param_group in param_groups for v in param_group["params"]}
    named_param_ids = {id(v) for k, v in named_parameters}
    unnamed_param_ids = all_param_ids - named_param_ids
    if len(unnamed_param_ids):
        raise ValueError("named_parameters was specified, but one or more model parameters were not "
                         "named. Python object ids: %s" % ", ".join(str(i) for i in unnamed_param_ids))
    return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


def _last_pass(opt, p):
    """In p's gradient hook: counts one backward pass of p and says whether it is the last before
    the allreduce (backward_passes_per_step); one pass too many before step() raises."""
    if p in opt._handles and opt._handles[p][0] is not None and opt._allreduce_delay[p] <= 0:
        raise AssertionError(
            "Gradients were computed more than backward_passes_per_step times before call to "
            "step(). Increase backward_passes_per_step to accumulate gradients locally.")
    assert not p.grad.requires_grad
    assert opt._allreduce_delay[p] > 0
    opt._allreduce_delay[p] -= 1
    return opt._allreduce_delay[p] == 0


class _DistributedOptimizer(torch.optim.Optimizer):
    _kolo_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set, shared_gradients=None):
        super(self.__class__, self).__init__(params)
        self._compression = compression

        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step for v in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True

        if groups is not None:
            if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
                raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
            if isinstance(groups, list):
                seen = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in seen:
                            raise ValueError("A parameter can only appear once in groups.")
                        seen.add(id(p))
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}
        self._arena = {}  # parameter -> its gradient's place in a shared arena
        self._placed = set()  # parameters whose gradient is (or was last) in its place

        # In an elastic job the size may grow later: the hooks are needed with one worker too.
        if self.process_set.included() and (size() > 1 or _elastic()):
            if _shared_gradients_wanted(shared_gradients, compression):
                self._place_gradients()
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        seen, dups = set(), set()
        for el in lst:
            if el in seen:
                dups.add(el)
            seen.add(el)
        return dups

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _place_gradients(self):
        """Gives every contiguous CPU parameter's gradient a place in one arena per dtype, 64-byte
        aligned, in the order of the parameter groups; the hook moves gradients in."""
        by_dtype = {}
        for group in self.param_groups:
            for p in group["params"]:
                if (p.requires_grad and p.device.type == "cpu" and p.dtype in _ARENA_DTYPES
                        and p.layout == torch.strided and p.is_contiguous() and p not in self._arena):
                    by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            es = torch.empty((), dtype=dtype).element_size()
            align = 64 // es
            offsets, n = [], 0
            for p in ps:
                offsets.append(n)
                n += (p.numel() + align - 1) // align * align
            arena = torch.from_numpy(kolo.shared_empty(max(n, 1) * es, dtype=np.uint8)).view(dtype)
            for p, o in zip(ps, offsets):
                self._arena[p] = arena[o:o + p.numel()].view(p.shape)

    def _into_arena(self, p):
        """Moves p's gradient into its place in the arena if it is elsewhere; a parameter whose
        gradient is sparse, or whose device, dtype or shape changed, gives up its place."""
        view = self._arena.get(p)
        if view is None or p.grad is None:
            return
        if p.grad.is_sparse or p.grad.device != view.device or p.grad.dtype != view.dtype \
                or p.grad.shape != view.shape:
            del self._arena[p]
            self._placed.discard(p)
            return
        if p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
            p.grad = view
        self._placed.add(p)

    def _register_hooks(self):
        if self._groups is not None:
            p_list = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
            # Every rank must form the same groups in the same order: take rank 0's order.
            names = broadcast_object([self._parameter_names.get(p) for p in p_list], root_rank=0,
                                     name="optimizer_param_order", process_set=self.process_set)
            pos = {n: i for i, n in enumerate(names)}
            p_list = sorted(p_list, key=lambda p: pos.get(self._parameter_names.get(p), len(pos)))
            if isinstance(self._groups, list):
                p_groups, grouped = [], set()
                ids = {id(p) for p in p_list}
                for group in self._groups:
                    p_groups.append([p for p in group if id(p) in ids])
                    grouped.update(id(p) for p in p_groups[-1])
                p_groups += [[p] for p in p_list if id(p) not in grouped]
            else:
                p_groups = _split_list(p_list, self._groups)
            for group in (tuple(g) for g in p_groups if g):
                for p in group:
                    self._p_to_group[p] = group
                self._group_counts[group] = 0

        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _scale_factors(self):
        if self.op == Average:
            # The engine divides by the set's size for Average; split the rest as asked.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _zero_grad_for(self, p):
        """This rank did not compute p's gradient (a branch not taken); others may have, so it
        still takes part, with zeros."""
        p.grad = self._arena[p].zero_() if p in self._placed else p.data.new(p.size()).zero_()

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            self._zero_grad_for(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if self.sparse_as_dense:
                p.grad = tensor = tensor.to_dense()
            else:
                return sparse_allreduce_async(tensor, name=name, op=self.op, process_set=self.process_set), None
        tensor_compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scale_factors()
        handle = allreduce_async_(tensor_compressed, name=name, op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps):
        name = self._parameter_names.get(ps[0])
        for p in ps:
            if p.grad is None:
                self._zero_grad_for(p)
        compressed = [self._compression.compress(p.grad) for p in ps]
        prescale, postscale = self._scale_factors()
        handle = grouped_allreduce_async_([c[0] for c in compressed], name=name, op=self.op,
                                          prescale_factor=prescale, postscale_factor=postscale,
                                          process_set=self.process_set)
        return handle, [c[1] for c in compressed]

    def _make_hook(self, p):
        def hook(*ignore):
            last = _last_pass(self, p)
            self._into_arena(p)
            handle, ctx = None, None
            if last:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        handle, ctxs = self._grouped_allreduce_grad_async(group)
                        self._handles[group] = (handle, ctxs)
                        for gp in group:  # the group's entry replaces its members' placeholders
                            self._handles.pop(gp, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting, with zeros, those that backward did
        not produce on this rank) and writes the averaged gradients into p.grad."""
        if not self.process_set.included():
            self._synchronized = True
            return
        completed = set()
        for key in self._handles.keys():
            if isinstance(key, tuple):
                completed.update(key)
            else:
                completed.add(key)
        missing = self._requires_update - completed
        for p in sorted(missing, key=lambda q: self._parameter_names.get(q, "")):
            if self._groups is not None and len(self._p_to_group.get(p, ())) > 1:
                group = self._p_to_group[p]
                if group not in self._handles:
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    for gp in group:
                        self._handles.pop(gp, None)
                    self._group_counts[group] = 0
                continue
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        try:
            for p, (handle, ctx) in self._handles.items():
                if isinstance(p, tuple):
                    outputs = synchronize(handle)
                    for gp, output, gctx in zip(p, outputs, ctx):
                        self._allreduce_delay[gp] = self.backward_passes_per_step
                        gp.grad.set_(self._compression.decompress(output, gctx))
                elif callable(handle):  # sparse
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    p.grad = handle()
                else:
                    output = synchronize(handle)
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    p.grad.set_(self._compression.decompress(output, ctx))
        finally:
            # After a failure too: drop the handles (each synchronize above consumed its own, or
            # will be dropped with the job), so zero_grad() does not report a race.
            for p, (handle, ctx) in self._handles.items():
                if not callable(handle):
                    synchronize_quiet(handle)
                for q in (p if isinstance(p, tuple) else (p,)):
                    self._allreduce_delay[q] = self.backward_passes_per_step
            self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit synchronize(), e.g. to clip gradients:
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        out = super(self.__class__, self).zero_grad(*args, **kwargs)
        # gradients in the shared arena stay there, zeroed, even when asked to be set to None:
        # backward then accumulates into them in place
        for p in self._placed:
            if p.grad is None:
                p.grad = self._arena[p].zero_()
        return out


def synchronize_quiet(handle):
    """Waits for a handle that may already be consumed, swallowing its error (the first
    error has been raised already)."""
    try:
        synchronize(handle)
    except Exception:
        pass


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """The delta optimizer that op=Adasum selects (Horovod's _DistributedAdasumOptimizer).

    Adasum combines what each rank would do to a parameter, not its gradient: when backward has
    produced p's final gradient, the hook runs the wrapped optimizer's step on p alone (so its
    state, momentum or Adam's moments, stays this rank's own), turns p into its update
    delta = new - start, and starts an in-place allreduce_async_ of that delta with op=Adasum,
    named after the parameter. step() waits for every delta and sets start += reduced delta and
    p = start, the same bits on every rank. Between backward and step() a parameter holds its
    local delta, not its value."""
    _kolo_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step for v in self._parameter_names}
        self.process_set = process_set
        self._handles = {}  # parameter -> (handle or None until its delta is submitted, compression ctx)
        self._grad_accs = []
        self._requires_update = set()
        self._starts = {}  # parameter -> its value before this step's local update
        # A rank outside the process set trains alone: no hooks, the wrapped optimizer's step.
        self._hooked = bool(self.process_set.included())
        if self._hooked:
            for param_group in self.param_groups:
                for p in param_group["params"]:
                    if p.requires_grad:
                        self._requires_update.add(p)
                        grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                        grad_acc.register_hook(self._make_hook(p))
                        self._grad_accs.append(grad_acc)

    set_backward_passes_per_step = _DistributedOptimizer.set_backward_passes_per_step

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def _submit_delta(self, p):
        """Steps the wrapped optimizer on p alone, leaves p's update in p and starts its Adasum
        allreduce. A parameter without a gradient is not moved by the step: its delta is zero,
        which Adasum treats as absent."""
        start = self._starts.get(p)
        if start is None:
            start = self._starts[p] = torch.empty_like(p.data)
        start.copy_(p.data)
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum,
                                  process_set=self.process_set)
        return handle, ctx

    def _make_hook(self, p):
        def hook(*ignore):
            handle, ctx = self._submit_delta(p) if _last_pass(self, p) else (None, None)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Nothing to wait for before step(): the deltas are combined and applied there."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # unreached; makes this the generator that contextmanager wants

    def step(self, closure=None):
        if not self._hooked:
            return super(self.__class__, self).step(closure)
        loss = closure() if closure is not None else None
        # Parameters whose hook did not fire (no gradient on this rank, or fewer backward passes than
        # backward_passes_per_step) take their local step now: the other ranks wait for their deltas.
        for p in sorted(self._requires_update - set(self._handles), key=lambda q: self._parameter_names.get(q, "")):
            self._handles[p] = self._submit_delta(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._submit_delta(p)
        try:
            for p, (handle, ctx) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), ctx)
                start = self._starts[p]
                start.add_(delta)
                p.data.copy_(start)
        finally:
            for p, (handle, ctx) in self._handles.items():
                synchronize_quiet(handle)
                self._allreduce_delay[p] = self.backward_passes_per_step
            self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=global_process_set,
                         shared_gradients=None):
    """An optimizer that wraps another torch.optim.Optimizer and averages gradients over every
    rank before applying them (Horovod's DistributedOptimizer; same arguments).

    named_parameters: model.named_parameters(), so that allreduces carry the parameters'
    names. compression: Compression.none or Compression.fp16 (gradients travel as float16).
    backward_passes_per_step: local gradient accumulation before each allreduce.
    op: Average (default), Sum, or Adasum: with more than one rank, the wrapped optimizer then
    steps on every rank's own gradients and the ranks' updates (deltas) are combined with Adasum
    in step(), as Horovod's delta optimizer does; groups, sparse_as_dense and shared_gradients do
    not apply to it (the engine fuses the deltas by itself; a sparse gradient gives a dense delta),
    synchronize() does nothing and skip_synchronize() raises AssertionError.
    gradient_predivide_factor f: gradients are scaled by 1/f before the sum and f/size after it
    (Average only). groups: an int (that many groups of parameters, each reduced in one
    grouped_allreduce) or a list of lists of parameters.
    sparse_as_dense: sparse gradients are densified first.
    shared_gradients (kolo's own): place the CPU gradients in one shared-memory arena per dtype,
    so that large fused buckets are read by the other ranks directly; None (default) means
    KOLO_TORCH_SHARED_GRADIENTS if set, else on when every rank runs on this host and
    compression is Compression.none. zero_grad() then zeroes gradients in place rather than
    setting them to None.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and (size() > 1 or _elastic()):
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set, shared_gradients)
