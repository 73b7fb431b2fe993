#!/usr/bin/python3
"""torch.distributed (Gloo backend) collectives, printing nccl-tests' columns.

Run with Debian's python (where python3-torch lives):

    /usr/bin/python3 bench/peers/torch_dist_bench.py all -np 2 -d float32,float16 -B 8:1M:20:5

-np N forks N local ranks (env:// rendezvous on 127.0.0.1, Gloo over TCP on lo); without it the
script expects RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT like torchrun sets them.

Calls: allreduce = dist.all_reduce (in-place only), allgather = dist.all_gather into views of one
buffer (out-of-place only), broadcast = dist.broadcast (in-place only), reducescatter =
dist.reduce_scatter (ProcessGroupGloo in torch 1.13 has none: reported and skipped), alltoall =
dist.all_to_all_single (out-of-place only).
"""

import os
import subprocess
import sys

import benchcommon as bc


def spawn(n, argv):
    port = bc.free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    rc = 0
    for p in procs:
        rc = max(rc, p.wait())
    return rc


def main(argv):
    args = bc.parse_args(argv, "torch_dist_bench.py")
    if args.np and "RANK" not in os.environ:
        strip = []
        skip = False
        for a in argv:  # pass everything but -np N to the ranks
            if skip:
                skip = False
                continue
            if a == "-np":
                skip = True
                continue
            strip.append(a)
        return spawn(args.np, strip)

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    lib = "torch_dist_bench (torch %s, gloo)" % torch.__version__
    tdt = {"float32": torch.float32, "float16": torch.float16}
    root = args.r if 0 <= args.r < n else 0
    pattern, rank_sum, wrong = bc.torch_checks(torch, n)

    def barrier():
        dist.barrier()

    def sum_all(x, dtype, name):
        t = torch.tensor([x], dtype=dtype)
        dist.all_reduce(t)
        return t.item()

    def build(coll, dt, esize, sbuf, rbuf, req):
        """(count, size, ops) with ops: placement -> (prepare, call, verify), only the
        placements torch has a call for; None when the size holds no element per rank."""
        count, per, size = bc.sizes_for(coll, esize, req, n)
        if per == 0:
            return None
        send, recv = sbuf[:count], rbuf[:count]
        if coll == "allreduce":
            ops = {"ip": (lambda: recv.copy_(pattern(rank, count)),
                          lambda: dist.all_reduce(recv),
                          lambda: wrong(recv, rank_sum(count)))}
        elif coll == "allgather":
            small, outs = sbuf[:per], list(recv.chunk(n))
            ops = {"oop": (lambda: small.copy_(pattern(rank, per)),
                           lambda: dist.all_gather(outs, small),
                           lambda: sum(wrong(outs[r], pattern(r, per)) for r in range(n)))}
        elif coll == "broadcast":
            ops = {"ip": (lambda: recv.copy_(pattern(root, count)) if rank == root
                          else recv.zero_(),
                          lambda: dist.broadcast(recv, src=root),
                          lambda: wrong(recv, pattern(root, count)))}
        elif coll == "reducescatter":
            ins, out = list(send.chunk(n)), rbuf[:per]
            ops = {"oop": (lambda: send.copy_(pattern(rank, count)),
                           lambda: dist.reduce_scatter(out, ins),
                           lambda: wrong(out, rank_sum(per, rank * per)))}
        else:  # alltoall: block r of my result is block `rank` of rank r's input
            ops = {"oop": (lambda: send.copy_(pattern(rank, count)),
                           lambda: dist.all_to_all_single(recv, send),
                           lambda: sum(wrong(recv[r * per:(r + 1) * per],
                                             pattern(r, per, rank * per)) for r in range(n)))}
        return count, size, ops

    failed = bc.run_sweeps(torch, args, rank, n, root, lib, tdt,
                           lambda coll, dname, *rest: build(coll, tdt[dname], *rest),
                           sum_all, barrier, "torch %s gloo" % torch.__version__)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
