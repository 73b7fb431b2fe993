"""kolo.spark.keras.KerasEstimator on a local Spark (local[2]), with the TensorFlow venv's python
(scripts/deps-tf.sh gives it pyspark, pyarrow and pandas too). Outside kolorun: the estimator
starts its own ranks."""

import sys

import io

import numpy as np
import pytest

pytestmark = pytest.mark.standalone
pyspark = pytest.importorskip("pyspark")
tf = pytest.importorskip("tensorflow")
pytest.importorskip("pyarrow")

import keras  # noqa: E402

from kolo.spark.common import estimator as est  # noqa: E402
from kolo.spark.common.backend import SparkBackend  # noqa: E402
from kolo.spark.common.store import Store  # noqa: E402
from kolo.spark.keras import _remote  # noqa: E402
from kolo.spark.keras import KerasEstimator, KerasModel  # noqa: E402
from _spark_session import local_spark  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

W = np.array([1.0, -2.0, 0.5, 3.0])


@pytest.fixture(scope="module")
def spark():
    s = local_spark("kolo-spark-keras-tests")
    yield s
    s.stop()


def test_keras_estimator_trains_two_outputs_and_transforms(spark, tmp_path):
    # class = which of the first three features is largest, y = features . W + 0.3; a third of the
    # rows carry wrong labels and weight 0 (a decimal column: a SQL literal's type), and every 5th
    # row is validation
    from pyspark.ml.linalg import Vectors
    rng = np.random.default_rng(0)
    data = []
    for i in range(600):
        x = rng.normal(size=4)
        good = i % 3 != 0
        cls = int(np.argmax(x[:3])) if good else int((np.argmax(x[:3]) + 1) % 3)
        data.append((Vectors.dense(x.tolist()), cls, float(x @ W + 0.3) if good else -10.0, good, i % 5 == 0))
    df = spark.createDataFrame(data, ["features", "cls", "y", "good", "is_val"]).selectExpr(
        "*", "case when good then 1.0 else 0.0 end as w")
    keras.utils.set_random_seed(1)
    inp = keras.Input((4,))
    h = keras.layers.Dense(32, activation="relu")(inp)
    model = keras.Model(inp, [keras.layers.Dense(3, name="logits")(h),
                              keras.layers.Dense(1, name="value")(keras.layers.Concatenate()([inp, h]))])
    # the ranks stream their shards (KOLO_ESTIMATOR_MEMORY_MB=0) through a tf.data generator; the
    # shard held in memory is tested below, without Spark
    out = io.StringIO()
    backend = SparkBackend(num_proc=2, env={"KOLO_ESTIMATOR_MEMORY_MB": "0"}, verbose=0, stdout=out)
    e = KerasEstimator(backend=backend, store=Store.create(str(tmp_path / "store")), model=model,
                       optimizer=keras.optimizers.Adam(0.02),
                       loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
                       loss_weights=[1.0, 0.5], metrics=[["sparse_categorical_accuracy"], ["mae"]],
                       feature_cols=["features"], label_cols=["cls", "y"], sample_weight_col="w",
                       validation="is_val", batch_size=32, epochs=8, random_seed=3, partitions_per_process=1,
                       run_id="keras_two", verbose=1)
    fitted = e.fit(df)
    assert "[0]<stdout>:KerasEstimator: rank 0's shard: " in out.getvalue(), out.getvalue()[-3000:]
    assert isinstance(fitted, KerasModel)
    hist = fitted.getHistory()
    assert len(hist["loss"]) == 8 and len(hist["val_loss"]) == 8 and hist["loss"][-1] < hist["loss"][0] / 2, hist
    assert any("mae" in k for k in hist) and any(k.startswith("val_") and "accuracy" in k for k in hist), hist
    store = e.getStore()
    assert store.exists(store.get_checkpoint_path("keras_two"))
    assert not store.exists(store.get_train_data_path("keras_two"))
    assert not store.exists(store.get_val_data_path("keras_two"))
    # transform: the logits as a vector column, the value as a double
    rows = fitted.setOutputCols(["logits", "y_hat"]).transform(df.filter("good")).collect()
    assert len(rows[0].logits) == 3 and isinstance(rows[0].y_hat, float)
    acc = np.mean([int(np.argmax(r.logits.toArray())) == r.cls for r in rows])
    err = np.median([abs(r.y - r.y_hat) for r in rows])
    assert acc > 0.85 and err < 0.3, (acc, err)
    # bad settings, named before any rank starts (a rank that fails is named as in kolo.spark.torch's
    # tests: the same kolo.spark.run job)
    with pytest.raises(ValueError, match="the model has 2 outputs for 1 label columns"):
        e.copy().setLabelCols(["y"]).setLoss("mse").setLossWeights(None).fit(df)
    with pytest.raises(ValueError, match="optimizer must be a keras.optimizers.Optimizer"):
        e.copy().setOptimizer("adam").fit(df)


def test_a_shard_in_memory_and_one_streamed_give_the_same_batches():
    rows = 10
    data = {"f": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4), "c": np.arange(rows) % 3,
            "w": np.ones(rows)}
    inp = keras.Input((2, 2))
    model = keras.Model(inp, [keras.layers.Dense(3)(keras.layers.Flatten()(inp))])
    spec = {"feature_cols": ["f"], "label_cols": ["c"], "label_shapes": None, "sample_weight_col": "w"}

    class Streamed:  # what StreamedBatches gives, in order
        streamed = True

        def __init__(self):
            self.pos = 0

        def next(self):
            i = np.arange(self.pos, self.pos + 4) % rows
            self.pos += 4
            return {k: v[i] for k, v in data.items()}

    mem = est.MemoryBatches(data, rows, 4, False, 0)
    for src in (mem, Streamed()):
        x, y, w = next(iter(_remote._dataset(tf, est, model, src, spec, 4, False, 0)))
        # the feature shaped as the model's input, the label as stored (3 logits for an integer)
        assert x.shape == (4, 2, 2) and y.shape == (4,) and w.shape == (4,)
        assert np.array_equal(x.numpy().reshape(4, 4), data["f"][:4]) and y.dtype == tf.int64
