#!/usr/bin/env python3
"""Trains the digits CNN of examples/pytorch/digits.py from a Spark DataFrame with
kolo.spark.torch.TorchEstimator (Horovod's horovod.spark.torch.TorchEstimator), then scores a
held-out DataFrame with the TorchModel it returns.

    python3 examples/spark/spark_estimator_digits.py --num-proc 2

(12000 digits, 4 epochs: on this project's 2-core VM about 80 s in all, of which fit 32 s, and 96 %
of the 2000 held-out digits right.)

The images are a column of 784 floats, the digit an integer column; the estimator writes them as
Parquet in a store (--store, default a temporary directory), kolo trains on num_proc Spark tasks,
and transform() adds each row's ten logits as a vector column. Spark: local[num_proc] unless
--master names a cluster (then --store must be a directory every executor shares). Needs pyspark,
pyarrow and pandas (scripts/deps-spark.sh makes a venv with them) and, on the executors, kolo and
PyTorch.
"""

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, PYDIR)
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "pytorch")))


def accuracy(logits, label):
    return (logits.argmax(dim=1) == label).float().mean()


def main():
    ap = argparse.ArgumentParser(description="kolo.spark.torch.TorchEstimator: the digits CNN from a DataFrame")
    ap.add_argument("--num-proc", type=int, default=2, help="ranks: Spark tasks, all running at once")
    ap.add_argument("--master", default=None, help="Spark master (default: local[num-proc])")
    ap.add_argument("--rows", type=int, default=12000, help="digits generated; a sixth are held out for scoring")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.02, help="per rank (the step is lr * num-proc)")
    ap.add_argument("--store", default=None, help="the estimator's store (default: a temporary directory)")
    a = ap.parse_args()

    # In local mode the executors' Python workers inherit this environment: this Python, and this
    # source tree's kolo and digits.py (on a cluster, install kolo on the executors)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join([PYDIR, os.path.join(HERE, "..", "pytorch")] +
                                               [p for p in [os.environ.get("PYTHONPATH")] if p])
    import torch
    from pyspark.sql import SparkSession
    import digits
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    b = (SparkSession.builder.appName("kolo estimator digits").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false"))  # its progress bar would cut the ranks' lines
    if a.master or not os.environ.get("SPARK_ENV_LOADED"):  # spark-submit sets the master itself
        b = b.master(a.master or "local[%d]" % a.num_proc)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    x, y = digits.make_digits(0, a.rows, seed=42)
    rows = [(i, x[i].flatten().tolist(), int(y[i])) for i in range(a.rows)]
    df = spark.createDataFrame(rows, ["id", "image", "digit"])
    held_out = a.rows // 6
    train_df, test_df = df.filter(df.id >= held_out), df.filter(df.id < held_out)

    torch.manual_seed(0)
    net = digits.Net()
    with tempfile.TemporaryDirectory(prefix="kolo-estimator-") as tmp:
        est = TorchEstimator(num_proc=a.num_proc, store=Store.create(a.store or tmp), model=net,
                             optimizer=torch.optim.SGD(net.parameters(), lr=a.lr * a.num_proc, momentum=0.9),
                             loss=torch.nn.CrossEntropyLoss(), metrics=[accuracy], feature_cols=["image"],
                             label_cols=["digit"], input_shapes=[[-1, 1, 28, 28]], batch_size=a.batch_size,
                             epochs=a.epochs, validation=0.1, random_seed=1, partitions_per_process=2)
        t0 = time.time()
        model = est.fit(train_df)
        took = time.time() - t0
    h = model.getHistory()
    trained = (a.rows - held_out) * 0.9 * a.epochs
    print("fit: %d epochs on %d ranks in %.1f s (%.0f images/s, Spark's data preparation included); "
          "last epoch: loss %.3f, accuracy %.3f, val_loss %.3f, val_accuracy %.3f"
          % (a.epochs, a.num_proc, took, trained / took, h["loss"][-1], h["accuracy"][-1], h["val_loss"][-1],
             h["val_accuracy"][-1]))
    scored = model.setOutputCols(["logits"]).transform(test_df).select("digit", "logits").collect()
    right = sum(int(r.logits.toArray().argmax()) == r.digit for r in scored)
    print("held out: %d of %d digits right (%.3f)" % (right, len(scored), right / len(scored)))
    spark.stop()


if __name__ == "__main__":
    main()
