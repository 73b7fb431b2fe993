"""Elastic training with TensorFlow and Keras (kolo.tensorflow.elastic, kolo.keras.elastic). Multi-rank
(under kolorun, with the TensorFlow venv's python: see test_tensorflow.py), in a fixed job: the states
take rank 0's variables on sync and roll back to the last commit on restore; run() turns a kolo failure
inside a tf.function into HorovodInternalError and goes round its loop (with a real shutdown and init);
fit with the elastic callbacks goes on after HostsUpdatedInterrupt with the epochs it has left; a traced
step of an elastic job reads the world's size when it runs; a partial gradient aggregation is dropped on
sync."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
tf.get_logger().setLevel("ERROR")

import kolo  # noqa: E402
import kolo.keras as hvdk  # noqa: E402
import kolo.tensorflow as hvd  # noqa: E402
from kolo import _lib  # noqa: E402
from kolo import elastic as kel  # noqa: E402

keras = tf.keras


def n_r():
    return hvd.size(), hvd.rank()


def gathered_equal(arrays):
    """True when every rank holds the same values."""
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])[None]
    every = hvdk.allgather(flat)
    return all(np.array_equal(every[0], every[k]) for k in range(every.shape[0]))


def values(variables):
    return [np.array(v.numpy()) for v in variables]


def small_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])


def rank_data(r, n=8):
    rng = np.random.RandomState(100 + r)
    x = rng.randn(n, 3).astype(np.float32)
    return x, (x[:, :2] * (r + 1) + r).astype(np.float32)


@pytest.fixture
def fake_check(monkeypatch):
    """kolo_elastic_check answering from a list (one answer per call, then 0): KOLO_ELASTIC_ADDED 1,
    KOLO_ELASTIC_REMOVED 2."""
    answers = []

    def check(ptr):
        ptr._obj.value = answers.pop(0) if answers else 0
        return _lib.OK
    monkeypatch.setattr(_lib, "kolo_elastic_check", check)
    return answers


def test_elastic_modules_are_where_horovod_has_them():
    assert hvd.elastic.run and hvd.elastic.TensorFlowKerasState and hvd.elastic.TensorFlowState
    for name in ("run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"):
        assert hasattr(hvdk.elastic, name), name
    assert issubclass(hvdk.elastic.KerasState, hvd.elastic.TensorFlowKerasState)


def test_tensorflow_state_syncs_and_restores_variables():
    n, r = n_r()
    a = tf.Variable(tf.fill([3], float(r)))
    b = tf.Variable(r, dtype=tf.int64)
    state = hvd.elastic.TensorFlowState([a, b], step=r)
    state.sync()
    assert a.numpy().tolist() == [0.0] * 3 and int(b.numpy()) == 0 and state.step == 0
    a.assign([1.0, 2.0, 3.0])
    state.step = 1
    state.commit()
    a.assign_add([5.0, 5.0, 5.0])
    b.assign(7)
    state.step = 2
    state.restore()
    assert a.numpy().tolist() == [1.0, 2.0, 3.0] and int(b.numpy()) == 0 and state.step == 1
    with pytest.raises(NotImplementedError):
        hvd.elastic.TensorFlowState([a], session=object())


def test_keras_state_syncs_and_restores_the_model_and_its_optimizer():
    n, r = n_r()
    model = small_model(r)  # different weights on every rank
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    with pytest.raises(ValueError, match="built"):
        hvdk.elastic.KerasState(keras.Sequential([keras.layers.Dense(2)]))
    state = hvdk.elastic.KerasState(model, epoch=r)
    assert len(opt.variables) > 2  # made for the model's variables, so that every rank has the same list
    state.sync()
    assert gathered_equal(values(model.variables) + values(opt.variables)) and state.epoch == 0
    x, y = rank_data(r)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    state.epoch = 1
    state.commit()
    committed = values(model.variables) + values(opt.variables)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    state.epoch = 2
    assert not all(np.array_equal(a, b) for a, b in zip(values(model.variables), committed))
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(values(model.variables) + values(opt.variables), committed))
    assert state.epoch == 1 and int(opt.iterations.numpy()) == 2


def test_run_turns_a_failure_inside_a_graph_into_a_reset():
    n, r = n_r()
    if n < 2:
        pytest.skip("needs 2 ranks to fail a collective")
    v = tf.Variable(0.0)
    state = hvd.elastic.TensorFlowState([v])
    tries = []

    @tf.function
    def step(k):
        # the first try sends a different shape on every rank: the allreduce fails on all of them
        return hvd.allreduce(tf.ones(tf.where(k == 1, r + 1, 1)), op=hvd.Sum, name="elastic.step")

    @hvd.elastic.run
    def train(state):
        tries.append(1)
        v.assign_add(1.0)  # rolled back after the failure
        return step(tf.constant(len(tries))).numpy().tolist()

    assert train(state) == [float(n)]
    assert len(tries) == 2 and float(v.numpy()) == 1.0 and kolo.is_initialized()

    @hvd.elastic.run
    def other_error(state):
        tf.debugging.assert_equal(tf.constant(1), tf.constant(2), message="not kolo's")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not kolo's"):
        other_error(state)


def test_fit_with_the_elastic_callbacks_goes_on_after_hosts_updated(monkeypatch, fake_check):
    n, r = n_r()
    resets = []
    monkeypatch.setattr(kel, "_reset", lambda: resets.append(hvd.size()))
    model = small_model(0)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    state = hvdk.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    # after the reset, before the callbacks: Keras is to trace the train step again
    state.register_reset_callbacks([lambda: commits.append(("reset", model.train_function is None))])
    real_commit = state.commit

    def commit():
        commits.append((state.epoch, state.batch))
        real_commit()
    state.commit = commit
    callbacks = [hvdk.elastic.UpdateEpochStateCallback(state), hvdk.elastic.UpdateBatchStateCallback(state),
                 hvdk.elastic.CommitStateCallback(state, batches_per_commit=2)]
    x, y = rank_data(r, 16)
    traced = []
    # the 3rd commit (epoch 0, after batch 4: the end of the epoch) finds a newer round with new workers
    fake_check[:] = [0, 0, 1]

    @hvdk.elastic.run
    def train(state):
        model.fit(x, y, batch_size=4, epochs=3 - state.epoch, callbacks=callbacks, verbose=0, shuffle=False)
        traced.append(model.train_function)
        return state.epoch

    assert train(state) == 3
    assert resets == [n]
    # two commits per epoch of 4 batches and one at its end; the interrupted epoch is finished first
    assert commits == [(0, 2), (0, 4), (1, 0), ("reset", True), (1, 2), (1, 4), (2, 0), (2, 2), (2, 4), (3, 0)]
    assert len(traced) == 1 and traced[0] is not None  # the first fit ended with the interrupt
    assert gathered_equal(values(model.variables))


def test_elastic_callbacks_count_epochs_and_batches_across_resets():
    state = kel.ObjectState(epoch=2, batch=3)
    epochs = hvdk.elastic.UpdateEpochStateCallback(state)
    batches = hvdk.elastic.UpdateBatchStateCallback(state)
    batches.set_params({"steps": 10})
    for cb in (epochs, batches):
        cb.on_train_begin()
    epochs.on_epoch_begin(0)
    batches.on_epoch_begin(0)
    assert batches.params["steps"] == 7  # the interrupted epoch has 3 batches done
    batches.on_batch_end(0)
    assert state.batch == 4
    batches.on_epoch_end(0)
    epochs.on_epoch_end(0)
    assert (state.epoch, state.batch) == (3, 0)
    batches.on_epoch_begin(1)
    assert batches.params["steps"] == 10
    # fit(initial_epoch=state.epoch, epochs=total) numbers the epochs from there: counted the same
    epochs.on_train_begin()
    epochs.on_epoch_begin(3)
    epochs.on_epoch_end(3)
    assert state.epoch == 4


def test_sync_drops_a_partial_gradient_aggregation():
    n, r = n_r()
    model = small_model(0)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    model.compile(optimizer=opt, loss="mse")
    state = hvdk.elastic.KerasState(model)
    x, y = rank_data(r)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    agg = opt._kolo_aggregation
    assert int(agg.count.numpy()) == 1 and any(np.any(buf.numpy()) for _, buf in agg.sums.values())
    state.sync()
    assert int(agg.count.numpy()) == 0 and not any(np.any(buf.numpy()) for _, buf in agg.sums.values())


def test_a_traced_step_of_an_elastic_job_reads_the_size_when_it_runs(monkeypatch):
    """Averages that divide by the size in TensorFlow (sparse gradients, local gradients) take it from
    the job when the graph runs in an elastic job, where a later round may have another size."""
    n, r = n_r()
    monkeypatch.setattr(_lib, "kolo_elastic_enabled", lambda: 1)

    @tf.function
    def average(values):
        s = hvd.allreduce(tf.IndexedSlices(values, tf.constant([0, 1]), tf.constant([2], tf.int64)),
                          name="elastic.sparse")
        return s.values

    ones = tf.ones([2])
    assert np.allclose(average(ones).numpy(), np.full(2 * n, 1 / n))  # every rank's slices, averaged
    monkeypatch.setattr(_lib, "kolo_size", lambda: 2 * n)  # as if the next round had twice the workers
    assert np.allclose(average(ones).numpy(), np.full(2 * n, 1 / (2 * n)))
