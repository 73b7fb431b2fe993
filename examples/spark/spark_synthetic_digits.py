#!/usr/bin/env python3
"""Trains the digits CNN of examples/pytorch/pytorch_synthetic_digits.py on Spark: one kolo rank
per Spark task, started by kolo.spark.run (the API of Horovod's horovod.spark.run).

    python3 examples/spark/spark_synthetic_digits.py --num-proc 2 -- --epochs 2 --checkpoint-dir ''

Everything after `--` goes to the training script, which runs unchanged in every rank, as under
kolorun. Spark: local[num_proc] unless --master names a cluster (under spark-submit the session
it made is used). Needs pyspark (scripts/deps-spark.sh makes a venv with it) and, on the
executors, this kolo package and PyTorch.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, PYDIR)
import kolo.spark  # noqa: E402

SCRIPT = os.path.normpath(os.path.join(HERE, "..", "pytorch", "pytorch_synthetic_digits.py"))


def train(script, argv):
    """One rank: the training script as its own __main__, then what it measured."""
    import runpy
    sys.argv = [script] + list(argv)
    g = runpy.run_path(script, run_name="__main__")
    t = g.get("train_time") or 0.0
    return {"rank": int(os.environ["KOLO_RANK"]), "host": os.uname().nodename,
            "img_per_sec": g["train_samples"] / t if t > 0 else None, "val_acc": g.get("val_acc")}


def main():
    ap = argparse.ArgumentParser(description="kolo.spark: the digits CNN on Spark executors")
    ap.add_argument("--num-proc", type=int, default=2, help="ranks: Spark tasks, all running at once")
    ap.add_argument("--master", default=None, help="Spark master (default: local[num-proc])")
    ap.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the training script's arguments")
    a = ap.parse_args()
    argv = a.script_args[1:] if a.script_args[:1] == ["--"] else a.script_args

    # In local mode the executors' Python workers inherit this environment: this Python, and this
    # source tree's kolo (on a cluster, install kolo on the executors: pip install ./python)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join([PYDIR] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    from pyspark.sql import SparkSession
    b = (SparkSession.builder.appName("kolo digits").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false"))  # its progress bar would cut the ranks' lines
    if a.master or not os.environ.get("SPARK_ENV_LOADED"):  # spark-submit sets the master itself
        b = b.master(a.master or "local[%d]" % a.num_proc)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    t0 = time.time()
    results = kolo.spark.run(train, args=(SCRIPT, argv), num_proc=a.num_proc)
    for r in results:
        rate = "%.0f img/s" % r["img_per_sec"] if r["img_per_sec"] else "-"
        print("rank %d on %s: %s, val-acc %.3f" % (r["rank"], r["host"], rate, r["val_acc"] or 0.0))
    print("kolo.spark: %d ranks trained in %.1f s" % (len(results), time.time() - t0))
    spark.stop()


if __name__ == "__main__":
    main()
