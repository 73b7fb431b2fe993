"""kolo.spark.torch: Horovod's horovod.spark.torch.TorchEstimator, a Spark ML Estimator that trains
a PyTorch model on a DataFrame with kolo, and the TorchModel it returns.

    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    est = TorchEstimator(num_proc=2, store=Store.create("/shared/kolo"), model=net,
                         optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss=torch.nn.MSELoss(),
                         feature_cols=["features"], label_cols=["y"], input_shapes=[[-1, 8]],
                         batch_size=32, epochs=5, validation=0.1)
    model = est.fit(df)                        # a TorchModel
    predicted = model.transform(df)            # df with a "y__output" column

How fit runs: kolo/spark/common/estimator.py. The model, the loss functions and the metrics travel
to the executors by pickle; the optimizer as its class, its parameter groups and its state_dict
(each rank builds it again over its copy of the model). A feature column reaches the model as a
tensor of its stored shape (a scalar column (batch,), an array or vector column (batch, length)),
floating point as float32 and integers as int64, reshaped by input_shapes where given (shapes
with the batch dimension, -1); labels likewise by label_shapes, else shaped as the model's output
where they hold as many values. The history (getHistory()) has each epoch's loss and metrics,
averaged over the ranks: {"loss": [...], "val_loss": [...], "<metric>": [...], ...}.
"""

import copy
import functools
import io

from kolo.spark.common import estimator as est
from kolo.spark.common.base import EstimatorBase, ModelBase

__all__ = ["TorchEstimator", "TorchModel"]


class TorchEstimator(EstimatorBase):
    """Trains a torch.nn.Module on a Spark DataFrame with kolo (Horovod's TorchEstimator).

    Parameters (keyword arguments, each with a getX()/setX() pair): num_proc, backend, store, model,
    optimizer, loss (one callable, or one per label column), loss_constructors (callables that make
    the losses on the ranks), loss_weights, metrics (callables metric(output, label)), feature_cols,
    label_cols, input_shapes, label_shapes, sample_weight_col, validation, batch_size,
    val_batch_size, epochs, verbose, shuffle, shuffle_buffer_size, inmemory_cache_all, partitions_per_process, run_id,
    train_steps_per_epoch, validation_steps_per_epoch, gradient_compression,
    backward_passes_per_step, random_seed, train_minibatch_fn(model, optimizer, transform_outputs,
    loss_fn, inputs, labels, sample_weights) -> (outputs, loss). Accepted for Horovod's API without
    effect: reader_pool_type, train_reader_num_workers,
    val_reader_num_workers, mp_start_method. Refused: use_gpu=True, transformation_fn, callbacks."""

    _who = "TorchEstimator"
    _defaults = dict(est.COMMON_DEFAULTS, input_shapes=None, loss_constructors=None, train_minibatch_fn=None,
                     mp_start_method=None)

    def _check(self):
        import torch
        feats, labels = est.check_common(self, self._who)
        g = self.getOrDefault
        if not isinstance(g("model"), torch.nn.Module):
            raise ValueError("TorchEstimator: model must be a torch.nn.Module, got %s" % type(g("model")).__name__)
        opt = g("optimizer")
        if not isinstance(opt, torch.optim.Optimizer):
            raise ValueError("TorchEstimator: optimizer must be a torch.optim.Optimizer over the model's parameters, "
                             "got %s" % type(opt).__name__)
        ids = {id(p) for p in g("model").parameters()}
        if any(id(p) not in ids for grp in opt.param_groups for p in grp["params"]):
            raise ValueError("TorchEstimator: the optimizer holds parameters that are not the model's; make it over "
                             "model.parameters()")
        if g("loss") is None and not g("loss_constructors"):
            raise ValueError("TorchEstimator: loss (or loss_constructors) must be given")
        loss = g("loss")
        n = len(g("loss_constructors") or []) or (len(loss) if isinstance(loss, (list, tuple)) else len(labels))
        if n != len(labels):
            raise ValueError("TorchEstimator: %d losses for %d label columns" % (n, len(labels)))
        shapes = g("input_shapes")
        if shapes is not None and len(shapes) != len(feats):
            raise ValueError("TorchEstimator: input_shapes has %d entries for %d feature columns"
                             % (len(shapes), len(feats)))
        if g("callbacks"):
            raise ValueError("TorchEstimator: callbacks are not taken (Horovod's are for its Lightning estimator); "
                             "use train_minibatch_fn or metrics")
        return feats, labels

    def _trainer(self):
        from kolo.spark.torch import _remote
        return _remote.train

    def _trainer_spec(self):
        g = self.getOrDefault
        model, opt = g("model"), g("optimizer")
        index = {id(p): i for i, p in enumerate(model.parameters())}
        return {
            "model": model, "optimizer_cls": type(opt), "optimizer_state": opt.state_dict(),
            "optimizer_groups": [[index[id(p)] for p in grp["params"]] for grp in opt.param_groups],
            "loss": g("loss"), "loss_constructors": g("loss_constructors"), "metrics": g("metrics"),
            "input_shapes": g("input_shapes"), "train_minibatch_fn": g("train_minibatch_fn"),
        }

    def _make_model(self, result, run_id, info, feats, labels):
        g = self.getOrDefault
        model = copy.deepcopy(g("model"))
        model.load_state_dict(result["model"])
        opt = g("optimizer")
        params = list(model.parameters())
        index = {id(p): i for i, p in enumerate(g("model").parameters())}
        new_opt = type(opt)([{"params": [params[index[id(p)]] for p in grp["params"]]} for grp in opt.param_groups],
                            lr=opt.param_groups[0].get("lr", 0.001))
        new_opt.load_state_dict(result["optimizer"])
        return TorchModel(history=result["history"], model=model, optimizer=new_opt, feature_columns=feats,
                          label_columns=labels, input_shapes=g("input_shapes"), run_id=run_id, metadata=info,
                          loss=g("loss"))


class TorchModel(ModelBase):
    """A trained PyTorch model (Horovod's TorchModel): transform(df) adds its outputs as columns.
    getModel(), getOptimizer() (with the trained state), getHistory(), getRunId(),
    getFeatureColumns(), getLabelColumns(), getInputShapes(), getOutputCols(), setOutputCols(cols)."""

    _who = "TorchModel"
    _defaults = dict(history=None, model=None, optimizer=None, feature_columns=None, label_columns=None,
                     input_shapes=None, run_id=None, metadata=None, loss=None, output_cols=None)

    def _predictor(self):
        from kolo.spark.torch import _remote
        return functools.partial(_remote.predict, self.getModel(), self.getInputShapes())

    def save_state(self):
        """The model's state_dict as bytes (torch.save)."""
        import torch
        buf = io.BytesIO()
        torch.save(self.getModel().state_dict(), buf)
        return buf.getvalue()


est.add_params(TorchEstimator, est.COMMON_PARAMS + [
    ("input_shapes", "each feature column's shape as the model takes it, batch dimension -1 first"),
    ("loss_constructors", "callables that make the losses on the ranks (instead of loss)"),
    ("train_minibatch_fn", "fn(model, optimizer, transform_outputs, loss_fn, inputs, labels, sample_weights) "
                           "-> (outputs, loss): one training step"),
    ("mp_start_method", "accepted for Horovod's API (no reader processes in kolo)"),
])
est.add_params(TorchModel, [
    ("history", "each epoch's loss and metrics, averaged over the ranks"),
    ("model", "the trained torch.nn.Module"),
    ("optimizer", "the optimizer over the trained model, with its trained state"),
    ("feature_columns", "the feature columns, one model input each"),
    ("label_columns", "the label columns"),
    ("input_shapes", "each feature column's shape as the model takes it"),
    ("run_id", "the run's name in the store"),
    ("metadata", "the training data's columns: (kind, shape, dtype)"),
    ("loss", "the loss it was trained with"),
    ("output_cols", "the columns transform adds (default <label>__output)"),
])
