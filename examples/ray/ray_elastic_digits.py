#!/usr/bin/env python3
"""Elastic training of the digits CNN on Ray: examples/pytorch/pytorch_elastic_digits.py run by
kolo.ray.ElasticRayExecutor (the API of Horovod's horovod.ray.ElasticRayExecutor). Workers that
fail, or leave with their node, are gone and the others go on from the last commit; nodes that
join the cluster add workers, which get the state at the next commit.

    python3 examples/ray/ray_elastic_digits.py --min-workers 2 --max-workers 3 -- --epochs 2 --simulate-failure 2:0:15

Everything after `--` goes to the elastic training script (its --simulate-failure ID:EPOCH:BATCH
makes worker ID exit there). Ray: a local cluster unless --address names one (e.g. auto). Needs
Ray (scripts/deps-ray.sh makes a venv with it), kolorun on this machine, and on every node this
kolo package and PyTorch.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, PYDIR)

SCRIPT = os.path.normpath(os.path.join(HERE, "..", "pytorch", "pytorch_elastic_digits.py"))


def train(script, argv):
    """One worker: the elastic training script as its own __main__, then what it measured."""
    import runpy
    sys.argv = [script] + list(argv)
    g = runpy.run_path(script, run_name="__main__")
    return {"worker": int(os.environ["KOLO_ELASTIC_ID"]), "host": os.uname().nodename, "val_acc": g["acc"],
            "samples": g["state"].samples}


def main():
    ap = argparse.ArgumentParser(description="kolo.ray: the digits CNN, elastically, on Ray")
    ap.add_argument("--min-workers", type=int, default=2, help="fewest workers the job goes on with")
    ap.add_argument("--max-workers", type=int, default=None, help="most workers (default: every slot)")
    ap.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
    ap.add_argument("--num-cpus", type=int, default=None, help="a local cluster's CPUs (its slots)")
    ap.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the training script's arguments")
    a = ap.parse_args()
    argv = a.script_args[1:] if a.script_args[:1] == ["--"] else a.script_args

    # the workers' python finds this source tree's kolo (on a cluster, install it on the nodes)
    os.environ["PYTHONPATH"] = os.pathsep.join([PYDIR] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    import ray
    from kolo.ray import ElasticRayExecutor
    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(num_cpus=a.num_cpus or max(a.max_workers or 0, a.min_workers, os.cpu_count() or 1),
                 include_dashboard=False)

    t0 = time.time()
    settings = ElasticRayExecutor.create_settings(min_num_proc=a.min_workers, max_num_proc=a.max_workers,
                                                  timeout_s=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    results = executor.run(lambda: train(SCRIPT, argv))
    for r in results:
        print("worker %d on %s: %d samples, val-acc %.3f" % (r["worker"], r["host"], r["samples"], r["val_acc"]))
    print("kolo.ray: elastic job of %d workers at its end, in %.1f s" % (len(results), time.time() - t0))
    ray.shutdown()


if __name__ == "__main__":
    main()
