#!/usr/bin/python3
"""Horovod (horovod.torch, Gloo controller and data plane) collectives, nccl-tests' columns.

    horovodrun --gloo -np 2 -H localhost:2 --network-interface lo \\
        /usr/bin/python3 bench/peers/horovod_bench.py all -d float32,float16 -B 8:1M:20:5

-np N here runs that horovodrun line for you. Horovod runs with its defaults (background thread,
HOROVOD_CYCLE_TIME, 128 MiB fusion buffer), which is what a user gets.

Calls: allreduce = hvd.allreduce (out-of-place) / hvd.allreduce_ (in-place), allgather =
hvd.allgather (out-of-place only; returns a new tensor), broadcast = hvd.broadcast /
hvd.broadcast_, reducescatter = hvd.reducescatter (out-of-place), alltoall = hvd.alltoall
(out-of-place, equal splits). A call the build does not support is reported and skipped.
"""

import os
import shutil
import subprocess
import sys

import benchcommon as bc


def launch(n, argv):
    runner = shutil.which("horovodrun") or "/usr/local/bin/horovodrun"
    cmd = [runner, "--gloo", "-np", str(n), "-H", "localhost:%d" % n,
           "--network-interface", "lo", sys.executable, os.path.abspath(__file__)] + argv
    return subprocess.call(cmd)


def main(argv):
    args = bc.parse_args(argv, "horovod_bench.py")
    if args.np and "HOROVOD_RANK" not in os.environ:
        rest, skip = [], False
        for a in argv:
            if skip:
                skip = False
            elif a == "-np":
                skip = True
            else:
                rest.append(a)
        return launch(args.np, rest)

    import torch
    import horovod
    import horovod.torch as hvd

    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    lib = "horovod_bench (horovod %s, torch %s, gloo)" % (horovod.__version__, torch.__version__)
    tdt = {"float32": torch.float32, "float16": torch.float16}
    root = args.r if 0 <= args.r < n else 0
    pattern, rank_sum, wrong = bc.torch_checks(torch, n)

    bar = torch.zeros(1)

    def barrier():
        hvd.allreduce_(bar, op=hvd.Sum, name="bench.barrier")

    def sum_all(x, dtype, name):
        return hvd.allreduce(torch.tensor([x], dtype=dtype), op=hvd.Sum, name=name).item()

    def build(coll, dname, esize, sbuf, rbuf, req):
        """(count, size, ops) with ops: placement -> (prepare, call, verify), only the
        placements Horovod has a call for; None when the size holds no element per rank."""
        count, per, size = bc.sizes_for(coll, esize, req, n)
        if per == 0:
            return None
        send, recv = sbuf[:count], rbuf[:count]
        out = {}  # the last result of an out-of-place call, for verification
        nm = "%s.%s.%d" % (coll, dname, size)

        def keep(fn):
            def call():
                out["o"] = fn()
            return call

        if coll == "allreduce":
            ops = {
                "oop": (lambda: send.copy_(pattern(rank, count)),
                        keep(lambda: hvd.allreduce(send, op=hvd.Sum, name=nm + ".o")),
                        lambda: wrong(out["o"], rank_sum(count))),
                "ip": (lambda: recv.copy_(pattern(rank, count)),
                       lambda: hvd.allreduce_(recv, op=hvd.Sum, name=nm + ".i"),
                       lambda: wrong(recv, rank_sum(count))),
            }
        elif coll == "allgather":
            small = sbuf[:per]
            ops = {"oop": (lambda: small.copy_(pattern(rank, per)),
                           keep(lambda: hvd.allgather(small, name=nm)),
                           lambda: sum(wrong(out["o"][r * per:(r + 1) * per], pattern(r, per))
                                       for r in range(n)))}
        elif coll == "broadcast":
            ops = {
                "oop": (lambda: send.copy_(pattern(root, count)) if rank == root
                        else send.zero_(),
                        keep(lambda: hvd.broadcast(send, root, name=nm + ".o")),
                        lambda: wrong(out["o"], pattern(root, count))),
                "ip": (lambda: recv.copy_(pattern(root, count)) if rank == root
                       else recv.zero_(),
                       lambda: hvd.broadcast_(recv, root, name=nm + ".i"),
                       lambda: wrong(recv, pattern(root, count))),
            }
        elif coll == "reducescatter":
            ops = {"oop": (lambda: send.copy_(pattern(rank, count)),
                           keep(lambda: hvd.reducescatter(send, op=hvd.Sum, name=nm)),
                           lambda: wrong(out["o"], rank_sum(per, rank * per)))}
        else:  # alltoall: block r of my result is block `rank` of rank r's input
            ops = {"oop": (lambda: send.copy_(pattern(rank, count)),
                           keep(lambda: hvd.alltoall(send, name=nm)),
                           lambda: sum(wrong(out["o"][r * per:(r + 1) * per],
                                             pattern(r, per, rank * per)) for r in range(n)))}
        return count, size, ops

    failed = bc.run_sweeps(torch, args, rank, n, root, lib, tdt, build, sum_all, barrier,
                           "horovod %s (gloo)" % horovod.__version__,
                           (RuntimeError, NotImplementedError, ValueError))
    barrier()
    hvd.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
