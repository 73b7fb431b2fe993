"""Elastic training with Keras (Horovod's horovod.tensorflow.keras.elastic): run, KerasState, and the
callbacks that keep the state's epoch and batch current and commit it during fit.

    import kolo.keras as hvd
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(opt), loss=...)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        state.model.fit(data, steps_per_epoch=steps, epochs=epochs - state.epoch, callbacks=callbacks)
    train(state)

The update callbacks go before CommitStateCallback, so that a commit saves the counts of the batch
it follows.
"""

import tensorflow as tf

from kolo.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401

keras = tf.keras


class KerasState(TensorFlowKerasState):
    """A built Keras model, its optimizer (model.optimizer when not given) and any picklable
    keyword attributes: see kolo.tensorflow.elastic.TensorFlowKerasState."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state (state.commit(): save, then check for a newer round of the job) after
    every batches_per_commit batches and at the end of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # fit starts again after every reset: every rank counts from here alike
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps state.batch at the number of batches of the current epoch that are done (0 at the end
    of an epoch). Keras numbers the batches of every fit call from 0; after a reset in the middle
    of an epoch the count goes on from the state's, and when fit knows its steps per epoch the
    epoch that was interrupted is told it has state.batch fewer (params["steps"], which Keras's
    progress bar and schedules read; how many batches fit runs is up to steps_per_epoch)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None
        self._done_before = 0

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self._done_before = self.state.batch
        if self.params and self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = self._done_before + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps state.epoch at the number of epochs done, across resets: fit is called again after
    every reset, and counts its epochs from initial_epoch (usually 0) each time."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch
        self._first = None

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch
        self._first = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._first is None:
            self._first = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + (epoch - self._first) + 1


__all__ = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"]
