#!/usr/bin/python3
"""What the runtime costs a training process while it does not communicate: the same code on
kolo.torch and on horovod.torch (the same API), so the two runtimes' background work is what
differs. Horovod's users report a CPU slowdown once hvd.init() has run.

    kolorun -np 2 /usr/bin/python3 bench/peers/idle_cpu.py kolo
    horovodrun --gloo -np 2 -H localhost:2 /usr/bin/python3 bench/peers/idle_cpu.py horovod

After init and 20 small allreduces (the engine has been used), two phases of SECONDS (-s, 3):
  idle     every rank sleeps, as while it computes a forward and backward pass or loads data
           without the runtime: the CPU its process used anyway (every thread), as a share of
           one core;
  waiting  rank 0 sleeps before an allreduce, as a straggler (a checkpoint, an evaluation), and
           the others wait for it in that allreduce: the CPU each waiting process used, which a
           straggler that computes on the same cores cannot use.
Rank 0 prints

    idle_cpu <library> ranks N idle_pct I waiting_pct W

(the means over the ranks, percent of one core), and every rank checks the allreduces' results.
"""

import argparse
import resource
import sys
import time


def cpu_s():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main(argv):
    ap = argparse.ArgumentParser(prog="idle_cpu.py")
    ap.add_argument("library", choices=("kolo", "horovod"))
    ap.add_argument("-s", "--seconds", type=float, default=3.0)
    a = ap.parse_args(argv)
    if a.seconds <= 0:
        ap.error("--seconds must be above 0")
    import torch
    if a.library == "kolo":
        import kolo.torch as hvd
    else:
        import horovod.torch as hvd
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    if n < 2:
        ap.error("needs 2 or more ranks")
    one = torch.ones(1)
    for _ in range(20):
        out = hvd.allreduce(one, name="idle_cpu.warm", op=hvd.Sum)
        assert out.item() == n, out
    c0 = cpu_s()
    time.sleep(a.seconds)
    idle = cpu_s() - c0
    hvd.allreduce(one, name="idle_cpu.sync", op=hvd.Sum)
    c0 = cpu_s()
    if me == 0:
        time.sleep(a.seconds)
    out = hvd.allreduce(one, name="idle_cpu.late", op=hvd.Sum)
    assert out.item() == n, out
    waiting = cpu_s() - c0 if me != 0 else 0.0
    sums = hvd.allreduce(torch.tensor([idle, waiting], dtype=torch.float64), name="idle_cpu.report", op=hvd.Sum)
    if me == 0:
        print("idle_cpu %s ranks %d idle_pct %.2f waiting_pct %.2f" % (
            a.library, n, 100 * sums[0].item() / a.seconds / n, 100 * sums[1].item() / a.seconds / (n - 1)))
        sys.stdout.flush()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
