#!/usr/bin/python3
"""What a latency-bound step costs through the engine: the same code on kolo.torch and on
horovod.torch (the same API), so the two engines' cycles and waits are what differs.

    kolorun -np 2 /usr/bin/python3 bench/peers/step_latency.py kolo
    horovodrun --gloo -np 2 -H localhost:2 --network-interface lo \\
        /usr/bin/python3 bench/peers/step_latency.py horovod

A step: T one-element float32 tensors (default 161, ResNet-50's parameter count) submitted with
allreduce_async_ under fixed names, averaged in place, then waited for in order, as
DistributedOptimizer.synchronize does after backward. From the second step on every name is
negotiated already (kolo's and Horovod's response caches). Each timed step follows an untimed
synchronous allreduce, so that the ranks start it together. Rank 0 prints

    step_latency <library> tensors T steps N median_us M p10_us A p90_us B

and every rank checks the results (each tensor ends at the average of its first values).
"""

import argparse
import statistics
import sys
import time

from benchcommon import horovod_api


def main(argv):
    ap = argparse.ArgumentParser(prog="step_latency.py")
    ap.add_argument("library", choices=("kolo", "horovod"))
    ap.add_argument("-t", "--tensors", type=int, default=161)
    ap.add_argument("-n", "--steps", type=int, default=300)
    ap.add_argument("-w", "--warmup", type=int, default=30)
    a = ap.parse_args(argv)
    hvd, torch = horovod_api(a.library)
    rank, n = hvd.rank(), hvd.size()
    ts = [torch.full((1,), float(rank * 1000 + i)) for i in range(a.tensors)]
    sync = torch.zeros(1)
    times = []
    for step in range(a.warmup + a.steps):
        hvd.allreduce_(sync, name="step_latency.sync")
        t0 = time.perf_counter()
        hs = [hvd.allreduce_async_(t, name="step_latency.g%d" % i, op=hvd.Average) for i, t in enumerate(ts)]
        for h in hs:
            hvd.synchronize(h)
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    want = [1000.0 * (n - 1) / 2 + i for i in range(a.tensors)]
    bad = [i for i, t in enumerate(ts) if abs(float(t[0]) - want[i]) > 1e-3 * max(1.0, abs(want[i]))]
    if bad:
        print("step_latency: rank %d: tensor %d is %g, expected %g" % (rank, bad[0], float(ts[bad[0]][0]),
                                                                      want[bad[0]]), file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        us = sorted(1e6 * x for x in times)
        print("step_latency %s tensors %d steps %d median_us %.1f p10_us %.1f p90_us %.1f" % (
            a.library, a.tensors, len(us), statistics.median(us), us[len(us) // 10], us[(9 * len(us)) // 10]),
            flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
