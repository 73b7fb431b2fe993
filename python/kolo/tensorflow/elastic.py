"""Elastic training with TensorFlow 2 (Horovod's horovod.tensorflow.elastic): run, and the states of
a Keras model with its optimizer (TensorFlowKerasState) or of a list of variables (TensorFlowState).

    import kolo.tensorflow as hvd
    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, steps):
            train_step(*next(data))   # a tf.function with DistributedGradientTape
            state.commit()
    train(state)

kolo.elastic has the loop's steps. Inside tf.function (and Keras's compiled steps) a failed
collective reaches Python as a tf.errors.OpError whose message holds kolo's
("HorovodInternalError: ..."): run() turns it back into HorovodInternalError, as Horovod's does,
so that the loop treats it as it treats an eager failure.
"""

import functools
import re

import tensorflow as tf

from kolo import elastic as _elastic
from kolo.basics import rank
from kolo.elastic import ObjectState
from kolo.exceptions import HorovodInternalError
from kolo.tensorflow.functions import broadcast_object, broadcast_variables


def run(func):
    """Decorator of a training function func(state, ...) (Horovod's hvd.elastic.run): see
    kolo.elastic.run; also catches kolo's failures raised inside TensorFlow graphs."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            found = re.search(r"HorovodInternalError: (.*)", e.message or "")
            if found is None:
                raise
            raise HorovodInternalError(found.group(1)) from e
    return _elastic.run_fn(wrapper, lambda: _elastic._reset())


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    v = getattr(optimizer, "variables", None)
    return list(v() if callable(v) else v or [])


def _snapshot(variables):
    """(variable, a copy of its value) for each variable."""
    return [(v, v.numpy().copy()) for v in variables]


def _assign(snapshot):
    for v, value in snapshot:
        v.assign(value)


class TensorFlowState(ObjectState):
    """A list of tf.Variables and any picklable keyword attributes (Horovod's TensorFlowState).
    save() keeps copies of the variables' values, restore() assigns them back, sync() assigns rank
    0's values on every rank (one broadcast batch). TensorFlow 1 sessions are not supported:
    session must be None. Without variables, tf.compat.v1.global_variables() (empty in eager
    TensorFlow 2)."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None:
            raise NotImplementedError("kolo.tensorflow supports TensorFlow 2 without sessions; pass session=None")
        self.variables = list(variables) if variables is not None else tf.compat.v1.global_variables()
        self._saved_variables = _snapshot(self.variables)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        self._saved_variables = _snapshot(self.variables)
        super().save()

    def restore(self):
        _assign(self._saved_variables)
        super().restore()

    def sync(self):
        broadcast_variables(self.variables, root_rank=0, name="elastic.variables")
        self._saved_variables = _snapshot(self.variables)
        super().sync()


class TensorFlowKerasState(ObjectState):
    """A built Keras model, its optimizer (model.optimizer when not given) and any picklable keyword
    attributes (Horovod's TensorFlowKerasState). save() keeps copies of the model's and the
    optimizer's variables, restore() assigns them back, sync() broadcasts rank 0's. An optimizer
    that has not made its variables yet (Keras makes them at the first step) makes them for the
    model's trainable variables at save() and sync(), so that every rank has the same list.
    reset() makes Keras trace the model's train, test and predict steps again: the last ones were
    traced in the previous round. backend is accepted for Horovod's signature."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer
        self.backend = backend
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _optimizer(self):
        opt = self.optimizer if self.optimizer is not None else getattr(self.model, "optimizer", None)
        built = getattr(opt, "built", getattr(opt, "_built", True))
        if opt is not None and not built and hasattr(opt, "build"):
            opt.build(self.model.trainable_variables)
        return opt

    def _save_model(self):
        self._saved_model = _snapshot(list(self.model.variables) + _optimizer_variables(self._optimizer()))

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        _assign(self._saved_model)
        super().restore()

    def sync(self):
        opt = self._optimizer()
        broadcast_variables(self.model.variables, root_rank=0, name="elastic.model")
        broadcast_variables(_optimizer_variables(opt), root_rank=0, name="elastic.optimizer")
        _drop_partial_aggregation(opt)
        self._save_model()
        super().sync()

    def reset(self):
        for attr in ("train_function", "test_function", "predict_function"):
            if getattr(self.model, attr, None) is not None:
                setattr(self.model, attr, None)


def _drop_partial_aggregation(optimizer):
    """A DistributedOptimizer with backward_passes_per_step=N sums gradients locally between its
    updates. A worker that joins has no such sums and starts counting at 0, so every rank drops its
    partial cycle: their counts agree, and the next update comes N steps on for all."""
    agg = getattr(optimizer, "__dict__", {}).get("_kolo_aggregation")
    if agg is None or agg.count is None:
        return
    agg.count.assign(0)
    for _, buf in agg.sums.values():
        buf.assign(tf.zeros_like(buf))


__all__ = ["run", "TensorFlowKerasState", "TensorFlowState", "ObjectState"]
