#!/usr/bin/env python3
"""Trains the digits CNN of examples/pytorch/pytorch_synthetic_digits.py on Ray: one kolo rank
per Ray actor, started by kolo.ray.RayExecutor (the API of Horovod's horovod.ray.RayExecutor).

    python3 examples/ray/ray_synthetic_digits.py --num-workers 2 -- --epochs 2 --checkpoint-dir ''

Everything after `--` goes to the training script, which runs unchanged in every rank, as under
kolorun. Ray: a local cluster unless --address names one (e.g. auto). Needs Ray
(scripts/deps-ray.sh makes a venv with it) and, on every node, this kolo package and PyTorch.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, PYDIR)

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
    ap = argparse.ArgumentParser(description="kolo.ray: the digits CNN on Ray actors")
    ap.add_argument("--num-workers", type=int, default=2, help="ranks: Ray actors of one CPU each")
    ap.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
    ap.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the training script's arguments")
    a = ap.parse_args()
    argv = a.script_args[1:] if a.script_args[:1] == ["--"] else a.script_args

    # A local cluster's workers inherit this environment: this source tree's kolo (on a cluster,
    # install kolo on the nodes: pip install ./python, or ship it in Ray's runtime_env)
    os.environ["PYTHONPATH"] = os.pathsep.join([PYDIR] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    import ray
    from kolo.ray import RayExecutor
    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(num_cpus=max(a.num_workers, os.cpu_count() or 1), include_dashboard=False)

    t0 = time.time()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=a.num_workers)
    executor.start()
    try:
        results = executor.run(train, args=(SCRIPT, argv))
    finally:
        executor.shutdown()
    for r in results:
        rate = "%.0f img/s" % r["img_per_sec"] if r["img_per_sec"] else "-"
        print("rank %d on %s: %s, val-acc %.3f" % (r["rank"], r["host"], rate, r["val_acc"] or 0.0))
    print("kolo.ray: %d ranks trained in %.1f s" % (len(results), time.time() - t0))
    ray.shutdown()


if __name__ == "__main__":
    main()
