"""kolo.spark.keras.KerasEstimator on a local Spark (local[2]), with the TensorFlow venv's python
(scripts/deps-tf.sh gives it pyspark, pyarrow and pandas too). Outside kolorun: the estimator
starts its own ranks."""

import os
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.standalone
pyspark = pytest.importorskip("pyspark")
tf = pytest.importorskip("tensorflow")
pytest.importorskip("pyarrow")

import keras  # noqa: E402

from kolo.spark.common.store import Store  # noqa: E402
from kolo.spark.keras import KerasEstimator, KerasModel  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

W = np.array([1.0, -2.0, 0.5, 3.0])


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2]").appName("kolo-spark-keras-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "4")
         .getOrCreate())
    s.sparkContext.setLogLevel("FATAL")
    yield s
    s.stop()


def _df(spark, rows, seed=0):
    from pyspark.ml.linalg import Vectors
    rng = np.random.default_rng(seed)
    data = []
    for i in range(rows):
        x = rng.normal(size=4)
        data.append((Vectors.dense(x.tolist()), float(x @ W + 0.3), int(np.argmax(x[:3])), i % 5 == 0))
    return spark.createDataFrame(data, ["features", "y", "cls", "is_val"])


def test_keras_estimator_trains_and_transforms(spark, tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    e = KerasEstimator(num_proc=2, store=Store.create(str(tmp_path / "store")), model=model,
                       optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"], feature_cols=["features"],
                       label_cols=["y"], validation="is_val", batch_size=16, epochs=5, random_seed=2,
                       partitions_per_process=1, run_id="keras_linear", verbose=0)
    fitted = e.fit(_df(spark, 301))
    assert isinstance(fitted, KerasModel)
    h = fitted.getHistory()
    assert sorted(h) == ["loss", "mae", "val_loss", "val_mae"] and len(h["loss"]) == 5, h
    assert h["loss"][-1] < h["loss"][0] / 100 and h["val_loss"][-1] < 1e-3, h
    kernel, bias = fitted.getModel().get_weights()
    assert np.allclose(kernel[:, 0], W, atol=0.02) and abs(bias[0] - 0.3) < 0.02
    store = e.getStore()
    assert store.exists(store.get_checkpoint_path("keras_linear"))
    assert not store.exists(store.get_train_data_path("keras_linear"))
    df = _df(spark, 50, seed=9)
    rows = fitted.transform(df).select("y", "y__output").collect()
    assert len(rows) == 50 and max(abs(r.y - r.y__output) for r in rows) < 0.05


def test_two_outputs_sample_weights_and_bad_settings(spark, tmp_path):
    keras.utils.set_random_seed(1)
    inp = keras.Input((4,))
    h = keras.layers.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, [keras.layers.Dense(3)(h), keras.layers.Dense(1)(h)])
    df = _df(spark, 400).selectExpr("features", "cls", "y", "case when cls = 2 then 0.0 else 1.0 end as w")
    e = KerasEstimator(num_proc=2, store=Store.create(str(tmp_path / "store")), model=model,
                       optimizer=keras.optimizers.Adam(0.02),
                       loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
                       loss_weights=[1.0, 0.5], feature_cols=["features"], label_cols=["cls", "y"],
                       sample_weight_col="w", validation=0.25, batch_size=32, epochs=6, random_seed=3,
                       partitions_per_process=1, verbose=0)
    fitted = e.fit(df)
    assert len(fitted.getHistory()["val_loss"]) == 6
    rows = fitted.setOutputCols(["logits", "y_hat"]).transform(df.filter("w > 0")).collect()
    assert len(rows[0].logits) == 3 and isinstance(rows[0].y_hat, float)
    acc = np.mean([int(np.argmax(r.logits.toArray())) == r.cls for r in rows])
    assert acc > 0.8, acc
    with pytest.raises(ValueError, match="the model has 2 outputs for 1 label columns"):
        e.copy().setLabelCols(["y"]).setLoss("mse").setLossWeights(None).fit(df)
    # (a rank that fails is named as in kolo.spark.torch's tests: the same kolo.spark.run job)
    with pytest.raises(ValueError, match="optimizer must be a keras.optimizers.Optimizer"):
        e.copy().setOptimizer("adam").fit(df)
