"""Keras callbacks of a data-parallel job (horovod/_keras/callbacks.py's behaviour): the same starting
weights on every rank, metrics averaged over the ranks, the learning-rate warm-up and schedule of
Goyal et al., "Accurate, Large Minibatch SGD" (2017), and a best-model checkpoint written by rank 0."""

import warnings

import numpy as np
import tensorflow as tf

import kolo
from kolo.basics import global_process_set, rank, size
from kolo.tensorflow.functions import broadcast_variables

keras = tf.keras


def _optimizer_variables(optimizer):
    v = getattr(optimizer, "variables", None)
    return list(v() if callable(v) else v or [])


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts root_rank's model weights to every rank when training starts, and the model's and
    the optimizer's variables after the first batch (when the optimizer's variables exist), so that
    every rank starts from the same state: random initialisation or a checkpoint read by one rank.
    local_variables (a variable or a collection of them; Horovod's model-parallel layers) are left
    out of both broadcasts: each rank keeps its own. device is accepted for Horovod's signature
    (kolo is CPU-only)."""

    def __init__(self, root_rank, device="", local_variables=None, process_set=global_process_set):
        super().__init__()
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set, frozenset)):
            local_variables = [local_variables]  # one variable
        self.local_variables = {id(v): v for v in local_variables}  # held, so the ids stay theirs
        self.root_rank = root_rank
        self.process_set = process_set
        self.broadcast_done = False

    def _shared(self, variables):
        return [v for v in variables if id(v) not in self.local_variables]

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            broadcast_variables(self._shared(self.model.variables), self.root_rank, self.process_set,
                                name="model_begin")

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(self._shared(self.model.variables), self.root_rank, self.process_set, name="model")
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            broadcast_variables(self._shared(_optimizer_variables(opt)), self.root_rank, self.process_set,
                                name="optimizer")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces every numeric metric of an epoch's logs by its average over the ranks (each rank
    computed it on its own data). Put it before the callbacks that read metrics (ReduceLROnPlateau,
    ModelCheckpoint, ...). device is accepted for Horovod's signature."""

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        # every metric in flight at once: the engine fuses them into one allreduce
        handles = [kolo.allreduce_async(np.asarray(logs[k], np.float64), name="metric.%s" % k,
                                        process_set=self.process_set) for k in keys]
        for k, h in zip(keys, handles):
            logs[k] = float(kolo.synchronize(h))


def _get_lr(optimizer):
    return float(np.asarray(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) from start_epoch until end_epoch
    (exclusive; None: to the end). multiplier is a number or a function of the epoch; staircase=True
    changes the rate at the start of each epoch, False at every batch with a fractional epoch
    (steps_per_epoch from fit when not given). momentum_correction scales the momentum by
    new_lr / old_lr for the batch where the rate changes, where the optimizer's momentum is a
    variable (Keras 2's legacy optimizers); Keras 3's (and Keras 2's since 2.11) is a constant of the
    compiled step and is left alone, with a warning. The rate in use is logged as 'lr' at the end of
    each epoch."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase if callable(multiplier) else True
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._restore_momentum = None
        self._warned = False

    def _steps(self):
        p = self.params or {}
        if p.get("steps"):
            return p["steps"]
        if p.get("samples") and p.get("batch_size"):
            return p["samples"] // p["batch_size"]
        raise ValueError("Could not autodetect the number of steps per epoch; pass steps_per_epoch to %s"
                         % type(self).__name__)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._steps()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _set_lr(self, epoch):
        opt = self.model.optimizer
        old = _get_lr(opt)
        new = self.initial_lr * self.multiplier(epoch)
        opt.learning_rate = new
        momentum = getattr(opt, "momentum", None)
        if not self.momentum_correction or not momentum or old == 0:
            return
        if hasattr(momentum, "assign"):
            self._restore_momentum = float(np.asarray(momentum))
            momentum.assign(self._restore_momentum * new / old)
        elif not self._warned and new != old:
            self._warned = True
            warnings.warn("%s: the optimizer's momentum is a Python number (Keras 3, and Keras 2's optimizers since "
                          "2.11), compiled into the training step, so it is not corrected while the learning rate "
                          "changes" % type(self).__name__)

    def on_batch_begin(self, batch, logs=None):
        e = self.current_epoch
        if e < self.start_epoch or (self.end_epoch is not None and e >= self.end_epoch):
            return
        if not self.staircase:
            self._set_lr(e + float(batch) / self.steps_per_epoch)
        elif batch == 0:
            self._set_lr(e)

    def on_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            self.model.optimizer.momentum.assign(self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Raises the learning rate gradually from initial_lr / size() to initial_lr over warmup_epochs
    (at every batch), as Horovod does: multiplier(e) = (e * (size - 1) / warmup_epochs + 1) / size,
    with e counted so that an epoch ends on a round value. initial_lr is the rate for the whole job
    (usually the single-worker rate times size()). verbose > 0 prints on rank 0 when the warm-up ends."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            n = size()
            return ((epoch + 1.0 / self.steps_per_epoch) * (n - 1) / warmup_epochs + 1) / n
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.verbose > 0 and epoch == self.end_epoch - 1 and rank() == 0:  # once, as Horovod
            print("\nEpoch %d: finished gradual learning rate warmup to %g." % (epoch + 1,
                                                                              _get_lr(self.model.optimizer)))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's ModelCheckpoint with save_best_only=True, saving on rank 0 only (Horovod's
    BestModelCheckpoint): at the end of an epoch (or every save_freq batches) rank 0 writes the
    model, or its weights with save_weights_only, when the monitored value ('val_loss' by
    default) is the best so far; the other ranks write nothing. Put MetricAverageCallback before
    it so that rank 0 judges the average over the ranks. Horovod's has no filepath argument (its
    Spark estimator sets the attribute); kolo's takes one, by keyword, or the attribute
    cb.filepath set before fit. Keras 3 wants it to end in '.keras' ('.weights.h5' with
    save_weights_only)."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch",
                 filepath=None):
        # Keras 3 checks the path's extension when made: give it a valid stand-in until filepath is set.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath if filepath is not None else placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs=None):
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint has no filepath: pass filepath=... or set its filepath attribute "
                             "before training")
        parent = getattr(super(), "on_train_begin", None)
        if parent is not None:
            parent(logs)

    def _save_model(self, epoch, batch, logs):
        if rank() == 0:
            super()._save_model(epoch, batch, logs)
