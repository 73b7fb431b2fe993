#!/usr/bin/python3
"""What a collective that returns a new tensor costs when the tensor is large: the same code on
kolo.torch and on horovod.torch (the same API), so the two libraries' handling of output memory
is what differs.

    kolorun -np 2 /usr/bin/python3 bench/peers/large_outputs.py kolo
    horovodrun --gloo -np 2 -H localhost:2 --network-interface lo \\
        /usr/bin/python3 bench/peers/large_outputs.py horovod

Three cases, each call timed alone after an untimed barrier-like allreduce, the output dropped
before the next call (as a training step drops last step's):
  allreduce   out of place, MB megabytes of float32 (default 64)
  allgather   MB megabytes of float32 from each rank
  varying     allgather of rows drawn at random per call, 90-100 % of MB / 2 (the same draws on
              every rank: sparse gradients' rows vary with the batch)
Rank 0 prints one line per case

    large_outputs <library> <case> mb MB calls N median_ms M

and every rank checks every output.
"""

import argparse
import random
import statistics
import sys
import time

from benchcommon import horovod_api


def main(argv):
    ap = argparse.ArgumentParser(prog="large_outputs.py")
    ap.add_argument("library", choices=("kolo", "horovod"))
    ap.add_argument("-m", "--mb", type=int, default=64)
    ap.add_argument("-n", "--calls", type=int, default=15)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    a = ap.parse_args(argv)
    hvd, torch = horovod_api(a.library)
    rank, n = hvd.rank(), hvd.size()
    sync = torch.zeros(1)
    elems = (a.mb << 20) // 4
    x = torch.full((elems,), float(rank + 1))
    rows16 = torch.full((elems // 32, 16), float(rank))  # MB / 2 in rows of 16 floats
    draws = random.Random(7)

    def allreduce():
        out = hvd.allreduce(x, name="lo.ar", op=hvd.Sum)
        return float(out[-1]) == n * (n + 1) / 2

    def allgather():
        out = hvd.allgather(x, name="lo.ag")
        return out.shape[0] == n * elems and all(float(out[i * elems]) == i + 1 for i in range(n))

    def varying():
        rows = int(rows16.shape[0] * draws.uniform(0.9, 1.0))
        out = hvd.allgather(rows16[:rows], name="lo.var")
        return out.shape[0] == n * rows and all(float(out[i * rows, 0]) == i for i in range(n))

    for case, f in (("allreduce", allreduce), ("allgather", allgather), ("varying", varying)):
        times = []
        for call in range(a.warmup + a.calls):
            hvd.allreduce_(sync, name="lo.sync")
            t0 = time.perf_counter()
            ok = f()
            dt = time.perf_counter() - t0
            if not ok:
                print("large_outputs: rank %d: %s call %d gave a wrong output" % (rank, case, call), file=sys.stderr,
                      flush=True)
                return 1
            if call >= a.warmup:
                times.append(dt)
        if rank == 0:
            print("large_outputs %s %s mb %d calls %d median_ms %.2f" % (a.library, case, a.mb, a.calls,
                                                                       1e3 * statistics.median(times)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
