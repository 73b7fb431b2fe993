"""kolo.spark.torch.TorchEstimator on a local Spark (local[2]), and the parts of the estimators that
need no Spark (reading a rank's shard, drawing batches). Run outside kolorun with a python that has
pyspark, pyarrow and pandas (scripts/deps-spark.sh makes one)."""

import io
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.standalone
pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
torch = pytest.importorskip("torch")

import pyarrow.parquet as pq  # noqa: E402

from kolo.spark import KoloSparkError  # noqa: E402
from kolo.spark.common import estimator as est  # noqa: E402
from kolo.spark.common.backend import SparkBackend  # noqa: E402
from kolo.spark.common.store import LocalStore, Store  # noqa: E402
from kolo.spark.torch import TorchEstimator, TorchModel  # noqa: E402
from _spark_session import local_spark  # noqa: E402

# the executors cannot import this file: its functions (losses, models) travel by value
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

W = np.array([1.0, -2.0, 0.5, 3.0])


@pytest.fixture(scope="module")
def spark():
    s = local_spark("kolo-spark-estimator-tests")
    yield s
    s.stop()


def _linear_df(spark, rows, seed=0):
    """features (a Spark ML vector of 4), y = features . W + 0.3, is_val on every 7th row."""
    from pyspark.ml.linalg import Vectors
    rng = np.random.default_rng(seed)
    data = []
    for i in range(rows):
        x = rng.normal(size=4)
        data.append((i, Vectors.dense(x.tolist()), float(x @ W + 0.3), i % 7 == 0))
    return spark.createDataFrame(data, ["id", "features", "y", "is_val"])


def _linear_estimator(tmp_path, **kw):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    args = dict(num_proc=2, store=Store.create(str(tmp_path / "store")), model=net,
                optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss=torch.nn.MSELoss(),
                feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=4, random_seed=1,
                partitions_per_process=1, verbose=0)
    args.update(kw)
    return TorchEstimator(**args)


def test_torch_estimator_in_a_pipeline_trains_on_every_rank_and_transforms(spark, tmp_path):
    # 301 rows, 43 of them validation: the two ranks' shards differ by a row, and every rank still
    # takes the same number of steps. The features reach the estimator as a Spark ML vector made
    # by the pipeline's VectorAssembler.
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    df = spark.createDataFrame([(r.id, r.y, r.is_val) + tuple(float(v) for v in r.features)
                                for r in _linear_df(spark, 301).collect()], ["id", "y", "is_val", "x0", "x1", "x2", "x3"])
    e = _linear_estimator(tmp_path, validation="is_val", run_id="linear", verbose=1)
    fitted = Pipeline(stages=[VectorAssembler(inputCols=["x0", "x1", "x2", "x3"], outputCol="features"), e]).fit(df)
    model = fitted.stages[-1]
    assert isinstance(model, TorchModel)
    h = model.getHistory()
    assert sorted(h) == ["loss", "val_loss"] and len(h["loss"]) == 4 and len(h["val_loss"]) == 4
    assert h["loss"][-1] < h["loss"][0] / 100 and h["val_loss"][-1] < 1e-3, h
    trained = model.getModel()
    assert np.allclose(trained.weight.detach().numpy()[0], W, atol=0.02)
    assert abs(float(trained.bias) - 0.3) < 0.02
    # the estimator's own model is untouched; the returned optimizer drives the trained one
    assert not np.allclose(e.getModel().weight.detach().numpy()[0], W, atol=0.1)
    assert model.getOptimizer().param_groups[0]["params"][0] is trained.weight
    # rank 0 checkpointed into the store; the intermediate data is gone
    store = e.getStore()
    ck = torch.load(io.BytesIO(store.read(store.get_checkpoint_path("linear"))))
    assert ck["epoch"] == 4 and ck["history"]["loss"] == h["loss"]
    assert not store.exists(store.get_train_data_path("linear"))
    assert not store.exists(store.get_val_data_path("linear"))
    # transform: one double column beside the DataFrame's own
    pred = fitted.transform(df)
    assert pred.columns == ["id", "y", "is_val", "x0", "x1", "x2", "x3", "features", "y__output"]
    rows = pred.select("y", "y__output").collect()
    assert len(rows) == 301
    assert max(abs(r.y - r.y__output) for r in rows) < 0.05


def _two_headed():
    class TwoHeads(torch.nn.Module):
        """(a scalar, a vector of 3) -> (logits of 3 classes, one regression value)."""

        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 16)
            self.cls = torch.nn.Linear(16, 3)
            self.reg = torch.nn.Linear(16, 1)

        def forward(self, a, b):
            h = torch.relu(self.body(torch.cat([a, b], dim=1)))
            return self.cls(h), self.reg(h)
    torch.manual_seed(0)
    return TwoHeads()


def accuracy(out, label):
    return (out.argmax(dim=1) == label).float().mean() if out.shape[-1] == 3 else torch.tensor(0.0)


def test_two_inputs_two_outputs_integer_labels_sample_weights_metrics(spark, tmp_path):
    # class = which of b's three values is largest; r = a + sum(b). Rows of weight 0 carry wrong
    # labels: a model that learned from them would miss. Gradients of two batches add up before
    # each step, and travel as float16.
    import kolo.torch as hvd
    rng = np.random.default_rng(3)
    data = []
    for i in range(600):
        a, b = float(rng.normal()), rng.normal(size=3)
        good = i % 3 != 0
        cls = int(np.argmax(b)) if good else int((np.argmax(b) + 1) % 3)
        r = a + float(b.sum()) if good else -10.0
        data.append((a, b.tolist(), cls, r, 1.0 if good else 0.0))
    df = spark.createDataFrame(data, ["a", "b", "cls", "r", "w"])
    net = _two_headed()
    e = TorchEstimator(num_proc=2, store=LocalStore(str(tmp_path / "store")), model=net,
                       optimizer=torch.optim.Adam(net.parameters(), lr=0.02),
                       loss=[torch.nn.CrossEntropyLoss(), torch.nn.functional.mse_loss], loss_weights=[1.0, 0.5],
                       metrics=[accuracy], feature_cols=["a", "b"], label_cols=["cls", "r"],
                       input_shapes=[[-1, 1], [-1, 3]], sample_weight_col="w", validation=0.2, batch_size=16,
                       backward_passes_per_step=2, gradient_compression=hvd.Compression.fp16,
                       epochs=8, random_seed=5, partitions_per_process=1, verbose=0)
    model = e.fit(df)
    h = model.getHistory()
    assert sorted(h) == ["accuracy_0", "accuracy_1", "loss", "val_accuracy_0", "val_accuracy_1", "val_loss"]
    assert len(h["loss"]) == 8 and h["loss"][-1] < h["loss"][0]
    pred = model.setOutputCols(["cls_logits", "r_hat"]).transform(df.filter("w > 0"))
    rows = pred.select("cls", "r", "cls_logits", "r_hat").collect()
    # a vector column for the 3 logits, a double for the regression
    assert len(rows[0].cls_logits) == 3 and isinstance(rows[0].r_hat, float)
    acc = np.mean([int(np.argmax(row.cls_logits.toArray())) == row.cls for row in rows])
    err = np.median([abs(row.r - row.r_hat) for row in rows])
    assert acc > 0.85 and err < 0.5, (acc, err)


def test_fit_on_parquet_streaming_the_shards(spark, tmp_path):
    # KOLO_ESTIMATOR_MEMORY_MB=0: every rank streams its shard's row groups instead of holding it
    df = _linear_df(spark, 200, seed=7)
    out = io.StringIO()
    e = _linear_estimator(tmp_path, epochs=8, num_proc=None, shuffle_buffer_size=40, verbose=1,
                          backend=SparkBackend(num_proc=2, env={"KOLO_ESTIMATOR_MEMORY_MB": "0"}, verbose=0, stdout=out))
    store = e.getStore()
    # Parquet as fit writes it: the vector as a float32 array
    from pyspark.ml.functions import vector_to_array
    df.select(vector_to_array("features", "float32").alias("features"), "y").repartition(3).write.parquet(
        store.get_full_path(store.get_train_data_path()))
    model = e.fit_on_parquet()
    assert "[0]<stdout>:TorchEstimator: rank 0's shard: 100 rows (" in out.getvalue(), out.getvalue()
    assert "streamed by row groups, shuffled 40 rows at a time" in out.getvalue(), out.getvalue()
    assert np.allclose(model.getModel().weight.detach().numpy()[0], W, atol=0.05)
    assert len(model.getHistory()["loss"]) == 8


def bad_loss(out, label):
    raise ValueError("this loss refuses")


def test_a_failing_rank_and_bad_input_are_named(spark, tmp_path):
    df = _linear_df(spark, 50)
    with pytest.raises(KoloSparkError, match=r"rank \d on .* failed .*ValueError: this loss refuses"):
        _linear_estimator(tmp_path, loss=bad_loss).fit(df)
    with pytest.raises(ValueError, match=r"no column 'nope' \(its columns: id, features, y, is_val\)"):
        _linear_estimator(tmp_path, feature_cols=["nope"]).fit(df)
    strings = spark.createDataFrame([("a", 1.0)] * 10, ["s", "y"])
    with pytest.raises(ValueError, match=r"column 's' is string; a feature, label or weight column must be numeric"):
        _linear_estimator(tmp_path, feature_cols=["s"]).fit(strings)
    with pytest.raises(ValueError, match=r"1 training rows for 2 ranks"):
        _linear_estimator(tmp_path).fit(df.limit(1))
    other = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match="holds parameters that are not the model's"):
        _linear_estimator(tmp_path, optimizer=torch.optim.SGD(other.parameters(), lr=0.1)).fit(df)
    with pytest.raises(ValueError, match="validation must be a fraction"):
        _linear_estimator(tmp_path, validation=1.5).fit(df)
    with pytest.raises(ValueError, match="use_gpu=True"):
        _linear_estimator(tmp_path, use_gpu=True).fit(df)
    with pytest.raises(ValueError, match="2 losses for 1 label columns"):
        _linear_estimator(tmp_path, loss=[bad_loss, bad_loss]).fit(df)
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'"):
        _linear_estimator(tmp_path, epoch=3)
    with pytest.raises(ValueError, match="LocalStore only"):
        Store.create("hdfs://namenode/kolo")


# ---- without Spark ----

def _write(path, n, row_group, first=0):
    """Rows first..first+n-1: x the row's number, v [x, -x]."""
    t = pa.table({"x": pa.array(np.arange(first, first + n, dtype=np.float64)),
                  "v": pa.array([[float(i), -float(i)] for i in range(first, first + n)], pa.list_(pa.float32()))})
    pq.write_table(t, path, row_group_size=row_group)


def test_shards_are_equal_shares_in_order(tmp_path):
    files = []
    for i, n in enumerate([5, 0, 12, 3]):  # an empty file, row groups of 4
        f = str(tmp_path / ("part-%d.parquet" % i))
        _write(f, n, 4)
        files.append(f)
    got = []
    for rank in range(3):
        cols, total = est.read_shard(files, rank, 3, ["x", "v"])
        assert total == 20
        assert cols["v"].shape == (len(cols["x"]), 2) and np.array_equal(cols["v"][:, 0], cols["x"])
        got.append(len(cols["x"]))
    assert got == [6, 7, 7]
    info = est.column_info(files, ["x", "v"])
    assert info["x"][0] == "scalar" and info["v"][:2] == ("array", (2,))


def test_ragged_null_and_missing_data_are_refused(tmp_path):
    f = str(tmp_path / "ragged.parquet")
    pq.write_table(pa.table({"v": pa.array([[1.0, 2.0], [3.0]])}), f)
    with pytest.raises(ValueError, match="column 'v' has rows of different lengths"):
        est.read_shard([f], 0, 1, ["v"])
    g = str(tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"x": pa.array([1.0, None, 3.0])}), g)
    with pytest.raises(ValueError, match="column 'x' has 1 null values"):
        est.read_shard([g], 0, 1, ["x"])
    with pytest.raises(FileNotFoundError, match="the store's directory must be one that the driver and every "
                                                 "executor share"):
        est.read_shard([str(tmp_path / "elsewhere.parquet")], 0, 1, ["x"])


def test_streamed_batches_read_the_shard_in_pieces(tmp_path, monkeypatch):
    files, first = [], 0
    for i, n in enumerate([7, 12, 5]):
        f = str(tmp_path / ("part-%d.parquet" % i))
        _write(f, n, 4, first)
        files.append(f)
        first += n
    # rank 1 of 2: rows 12..23, from 3 files' row groups
    monkeypatch.setenv("KOLO_ESTIMATOR_MEMORY_MB", "0")
    src = est.batch_source(files, 1, 2, ["x", "v"], 5, False, 0, False, None)
    assert src.streamed
    got = np.concatenate([src.next()["x"] for _ in range(5)])  # 25 rows: the 12 twice, in order, and one more
    assert got.tolist() == list(range(12, 24)) * 2 + [12]
    src.reset()
    assert src.next()["x"].tolist() == [12, 13, 14, 15, 16]
    # shuffled, with a buffer of the whole shard: one pass holds every row once
    src = est.batch_source(files, 1, 2, ["x", "v"], 4, True, 3, False, 12)
    first = [src.next() for _ in range(3)]
    assert sorted(np.concatenate([b["x"] for b in first]).tolist()) == list(range(12, 24))
    assert all(np.array_equal(b["v"][:, 0], b["x"]) for b in first)  # columns stay together
    # in memory when asked (inmemory_cache_all) or when the shard is small enough
    assert not est.batch_source(files, 1, 2, ["x"], 5, False, 0, True, None).streamed
    monkeypatch.setenv("KOLO_ESTIMATOR_MEMORY_MB", "1")
    mem = est.batch_source(files, 1, 2, ["x"], 5, False, 0, False, None)
    assert not mem.streamed and mem.next()["x"].tolist() == [12, 13, 14, 15, 16]


def test_batches_cover_the_shard_each_pass():
    b = est.Batches(10, 4, True, 7)
    seen = np.concatenate([b.next() for _ in range(5)])  # two passes of 10
    assert sorted(seen[:10].tolist()) == list(range(10)) and sorted(seen[10:].tolist()) == list(range(10))
    assert est.Batches(3, 2, False, 0).next().tolist() == [0, 1]
    assert est.steps(301, 16, 2, None) == 9 and est.steps(5, 16, 2, None) == 1 and est.steps(5, 16, 2, 7) == 7
