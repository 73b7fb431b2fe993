"""What each rank of a TorchEstimator's training job runs (train), and the prediction function of
TorchModel.transform (predict). Imported by name on the executors."""

import copy
import inspect
import io

import numpy as np


def _reshape(t, shape):
    return t if shape is None else t.reshape(list(shape))


def _tensors(torch, est, b, cols, shapes):
    out = []
    for i, c in enumerate(cols):
        a = np.ascontiguousarray(est.np_input(b[c]))
        out.append(_reshape(torch.from_numpy(a), shapes[i] if shapes else None))
    return out


def transform_outputs(outputs, labels):
    """The model's outputs as a list, and each label shaped as its output where they hold as many
    values (a scalar label beside an output of one value per row), else as it is."""
    outs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    shaped = [lab.reshape(o.shape) if lab.numel() == o.numel() and lab.shape != o.shape else lab
              for o, lab in zip(outs, labels)]
    return outs, shaped


def _unreduced(loss_fn):
    """loss_fn giving one value per row (for sample weights)."""
    if hasattr(loss_fn, "reduction"):
        fn = copy.copy(loss_fn)
        fn.reduction = "none"
        return fn
    try:
        if "reduction" in inspect.signature(loss_fn).parameters:
            return lambda o, lab: loss_fn(o, lab, reduction="none")
    except (TypeError, ValueError):
        pass
    raise ValueError("sample_weight_col needs losses that can give one value per row (a torch.nn loss module or "
                     "a torch.nn.functional loss, which take reduction='none'); %r cannot" % (loss_fn,))


def _loss_fns(spec, n_labels):
    if spec["loss_constructors"]:
        fns = [c() for c in spec["loss_constructors"]]
    else:
        loss = spec["loss"]
        fns = list(loss) if isinstance(loss, (list, tuple)) else [loss] * n_labels
    if len(fns) != n_labels:
        raise ValueError("%d losses for %d label columns" % (len(fns), n_labels))
    return fns


def calculate_loss(outputs, labels, loss_weights, loss_fns, sample_weights=None):
    """The weighted sum of each output's loss; with sample weights each row's loss is weighed, then
    averaged over the batch."""
    total = 0
    for o, lab, fn, w in zip(outputs, labels, loss_fns, loss_weights):
        if sample_weights is None:
            total = total + w * fn(o, lab)
        else:
            per_row = fn(o, lab).reshape(o.shape[0], -1).mean(dim=1)
            total = total + w * (per_row * sample_weights).mean()
    return total


def _metric_names(metrics, n_out):
    names = []
    for m in metrics:
        base = getattr(m, "__name__", None) or type(m).__name__
        names += [base] if n_out == 1 else ["%s_%d" % (base, j) for j in range(n_out)]
    return names


def _metric_values(metrics, outputs, labels):
    vals = []
    for m in metrics:
        for o, lab in zip(outputs, labels):
            v = m(o, lab)
            vals.append(float(v.detach()) if hasattr(v, "detach") else float(v))
    return vals


def _build_optimizer(spec, model):
    params = list(model.parameters())
    groups = [{"params": [params[i] for i in g]} for g in spec["optimizer_groups"]]
    state = spec["optimizer_state"]
    lr = state["param_groups"][0].get("lr", 0.001) if state["param_groups"] else 0.001
    opt = spec["optimizer_cls"](groups, lr=lr)
    opt.load_state_dict(state)  # the driver's hyperparameters (and state, if it had any)
    return opt


def train(spec):
    import torch
    import kolo.torch as hvd
    from kolo.spark.common import estimator as est
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if spec["seed"] is not None:
        torch.manual_seed(spec["seed"])
    feats, labels, wcol = spec["feature_cols"], spec["label_cols"], spec["sample_weight_col"]
    cols = feats + labels + ([wcol] if wcol else [])
    seed = spec["seed"] if spec["seed"] is not None else 0
    train_src = est.batch_source(spec["train_files"], rank, size, cols, spec["batch_size"], spec["shuffle"],
                                 seed * 1000003 + rank, spec["in_memory"], spec["shuffle_buffer_size"])
    val_src = est.batch_source(spec["val_files"], rank, size, cols, spec["val_batch_size"], False, 0,
                               spec["in_memory"], None) if spec["val_files"] else None
    if spec["verbose"] and rank == 0 and train_src.streamed:
        print("%s: rank 0's shard: %s (more than KOLO_ESTIMATOR_MEMORY_MB, %d MiB)"
              % (spec["who"], train_src.describe(), est.memory_limit() >> 20), flush=True)

    model = spec["model"]
    opt = _build_optimizer(spec, model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    bpps = spec["backward_passes_per_step"]
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    compression=spec["compression"] or hvd.Compression.none,
                                    backward_passes_per_step=bpps)
    loss_fns = _loss_fns(spec, len(labels))
    weighted_fns = [_unreduced(f) for f in loss_fns] if wcol else loss_fns
    loss_weights = spec["loss_weights"]
    metrics = spec["metrics"] or []
    in_shapes, lab_shapes = spec["input_shapes"], spec["label_shapes"]

    def loss_fn(outputs, labs, sample_weights=None):
        return calculate_loss(outputs, labs, loss_weights, weighted_fns if sample_weights is not None else loss_fns,
                              sample_weights)

    def batch(b):
        x = _tensors(torch, est, b, feats, in_shapes)
        y = _tensors(torch, est, b, labels, lab_shapes)
        w = torch.from_numpy(np.ascontiguousarray(b[wcol], dtype=np.float32)) if wcol else None
        return x, y, w

    steps = max(bpps, spec["train_steps"] // bpps * bpps)  # whole groups of backward passes
    names = ["loss"] + _metric_names(metrics, len(labels))
    history = {}
    fn = spec["train_minibatch_fn"]
    for epoch in range(spec["epochs"]):
        model.train()
        sums = np.zeros(len(names))
        for step in range(steps):
            x, y, w = batch(train_src.next())
            if fn is not None:  # Horovod's train_minibatch_fn: it zeroes, steps and returns (outputs, loss)
                outputs, loss = fn(model, dopt, transform_outputs, loss_fn, x, y, w)
                outputs, y = transform_outputs(outputs, y)
            else:
                if step % bpps == 0:
                    dopt.zero_grad()
                outputs, y = transform_outputs(model(*x), y)
                loss = loss_fn(outputs, y, w)
                loss.backward()
                if (step + 1) % bpps == 0:
                    dopt.step()
            sums += [float(loss.detach())] + _metric_values(metrics, outputs, y)
        means = hvd.allreduce(torch.tensor(sums / steps, dtype=torch.float64), op=hvd.Average,
                              name="kolo.spark.train.%d" % epoch)
        for k, v in zip(names, means.tolist()):
            history.setdefault(k, []).append(v)
        if val_src is not None:
            model.eval()
            val_src.reset()
            vsums = np.zeros(len(names))
            with torch.no_grad():
                for _ in range(spec["val_steps"]):
                    x, y, w = batch(val_src.next())
                    outputs, y = transform_outputs(model(*x), y)
                    vsums += [float(loss_fn(outputs, y, w))] + _metric_values(metrics, outputs, y)
            vmeans = hvd.allreduce(torch.tensor(vsums / spec["val_steps"], dtype=torch.float64), op=hvd.Average,
                                   name="kolo.spark.val.%d" % epoch)
            for k, v in zip(names, vmeans.tolist()):
                history.setdefault("val_" + k, []).append(v)
        if rank == 0:
            if spec["verbose"]:
                print("%s: epoch %d/%d: %s" % (spec["who"], epoch + 1, spec["epochs"], ", ".join(
                    "%s %.4g" % (k, v[-1]) for k, v in history.items())), flush=True)
            if spec["checkpoint"]:
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1,
                            "history": history}, buf)
                spec["store"].write(spec["checkpoint"], buf.getvalue())
    if rank != 0:
        return None
    return {"history": history, "model": model.state_dict(), "optimizer": opt.state_dict()}


def predict(model, input_shapes, arrays):
    """The model's outputs (numpy, rows first) for a batch of feature arrays."""
    import torch
    model.eval()
    with torch.no_grad():
        x = [_reshape(torch.from_numpy(np.ascontiguousarray(a)), input_shapes[i] if input_shapes else None)
             for i, a in enumerate(arrays)]
        out = model(*x)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.detach().cpu().numpy() for o in outs]
