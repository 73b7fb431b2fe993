"""Shared parts of the Python peers (torch_dist_bench.py, horovod_bench.py), and of the scripts
that run the same code on kolo.torch and horovod.torch (step_latency.py, large_outputs.py:
horovod_api).

Same command line and the same nccl-tests rows as bench/peers/mpi_coll_bench.c and
build/bin/kolo-bench:

    <coll>[,<coll>...]|all [-b 8] [-e 256M] [-f 2] [-n 20] [-w 5] [-c 1]
    [-d float32[,float16]] [-o sum] [-r 0] [-B lo:hi:iters:warmup[:factor],...] [-W ms] [-np N]
    [-H 1]

-W: before each collective's sweep, after the warm-up calls, keep calling at the first size until
some rank has spent this many milliseconds (the ranks agree after every call), so that a machine
that speeds up after its first moments of work meets the first timed size warm.

-H 1: the tensors in transparent huge pages (2 MiB), as mpi_coll_bench -H 1 and kolo-bench --mem
thp put their buffers: an anonymous mapping advised MADV_HUGEPAGE before its first touch, a tensor
on it through torch.frombuffer. Rank 0 prints how much of its memory the kernel gave in huge pages,
in the same words as they do (bench/bench_mem.h).

A placement the library has no call for (torch's all_reduce is in-place only, Horovod's
allgather is out-of-place only, ...) prints "-" in its four columns.
"""

import argparse
import ctypes
import mmap
import random
import re
import socket
import time


def horovod_api(library):
    """kolo.torch or horovod.torch ("kolo" or "horovod": the same API), initialized, with torch on
    one thread (one core per rank); returns (hvd, torch)."""
    if library == "kolo":
        import kolo.torch as hvd
    else:
        import horovod.torch as hvd
    import torch
    torch.set_num_threads(1)
    hvd.init()
    return hvd, torch

COLLS = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"]
ROOTED = {"broadcast"}
REDUCING = {"allreduce", "reducescatter"}
BLOCKED = {"allgather", "reducescatter", "alltoall"}  # size = per-rank block x nranks


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(float(s[:-1]) * mult[s[-1].lower()])
    return int(float(s))


def parse_args(argv, prog):
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("colls")
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="256M")
    p.add_argument("-f", type=float, default=2.0)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-c", type=int, default=1)
    p.add_argument("-d", default="float32")
    p.add_argument("-o", default="sum", choices=["sum"])
    p.add_argument("-r", type=int, default=0)
    p.add_argument("-B", default=None, help="bands lo:hi:iters:warmup[:factor],...")
    p.add_argument("-W", type=float, default=0.0, help="warm up at the first size for this many ms")
    p.add_argument("-np", type=int, default=None, help="fork N local ranks")
    p.add_argument("-H", type=int, default=0, choices=[0, 1], help="1: tensors in transparent huge pages")
    a = p.parse_args(argv)
    colls = []
    for c in a.colls.split(","):
        if c == "all":
            colls += COLLS
        elif c in COLLS:
            colls.append(c)
        else:
            p.error("unknown collective %r" % c)
    a.coll_list = colls
    a.dtypes = []
    for d in a.d.split(","):
        d = {"float": "float32", "half": "float16"}.get(d, d)
        if d not in ("float32", "float16"):
            p.error("unknown type %r" % d)
        a.dtypes.append(d)
    if a.B:
        a.bands = []
        for tok in a.B.split(","):
            f = tok.split(":")
            if len(f) not in (4, 5):
                p.error("bad band %r (want lo:hi:iters:warmup[:factor])" % tok)
            a.bands.append((parse_size(f[0]), parse_size(f[1]), int(f[2]), int(f[3]),
                            float(f[4]) if len(f) == 5 else a.f))
    else:
        a.bands = [(parse_size(a.b), parse_size(a.e), a.n, a.w, a.f)]
    if a.f <= 1:
        p.error("-f must be > 1")
    if not 0 <= a.W <= 60000:
        p.error("-W must be 0 to 60000 ms")
    return a


def sweep(bands):
    """Yields (requested size, iters, warmup, band) like the C tools: bands in order, no size
    twice; band is (lo, hi) on the first size of each band (warm up there, as nccl-tests does at
    the largest and then the smallest size before a sweep), else None."""
    last = 0
    for lo, hi, iters, warmup, factor in bands:
        req, first = lo, True
        while req <= hi:
            if req > last:
                yield req, iters, warmup, ((lo, hi) if first else None)
                first = False
                last = req
            nxt = int(req * factor)
            req = nxt if nxt > req else req + 1


def sizes_for(coll, elem_size, req, nranks):
    """(count, per-rank block count, size in bytes) in nccl-tests' terms."""
    count = req // elem_size
    if coll in BLOCKED:
        per = count // nranks
        count = per * nranks
    else:
        per = count
    return count, per, count * elem_size


def bus_factor(coll, n):
    if coll == "allreduce":
        return 2.0 * (n - 1) / n
    if coll == "broadcast":
        return 1.0
    return (n - 1) / n


def torch_checks(torch, n):
    """The result checks of the torch-based peers for a job of n ranks: pattern(r, count, offset)
    (what rank r contributes), rank_sum(count, offset) (the sum over all ranks) and
    wrong(got, expect) (how many elements differ)."""
    def pattern(r, count, offset=0):
        return torch_pattern(torch, [r], count, offset)

    def rank_sum(count, offset=0):
        return torch_pattern(torch, range(n), count, offset)

    def wrong(got, expect):
        return int((got.to(torch.float32) != expect).sum().item())

    return pattern, rank_sum, wrong


def header(coll, dtype, lib, nranks, args):
    bands = " ".join("%d-%d(n%d,w%d,f%g)" % b for b in args.bands)
    print("# Collective test starting: %s" % coll)
    print("# %s nranks %d type %s validation: %d bands: %s" % (lib, nranks, dtype, args.c, bands))
    print("#")
    print("#                                                              out-of-place"
          "                       in-place")
    print("#       size         count      type   redop    root     time   algbw   busbw #wrong"
          "     time   algbw   busbw #wrong")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
          "      (us)  (GB/s)  (GB/s)")


def _fmt_time(us):
    if us >= 10000:
        return "%7.0f" % us
    if us >= 100:
        return "%7.1f" % us
    return "%7.2f" % us


def _placement(res, size, factor):
    if res is None:
        return "%7s  %6s  %6s  %6s" % ("-", "-", "-", "-")
    us, wrong = res
    alg = size / 1e3 / us
    w = "N/A" if wrong is None else str(wrong)
    return "%7s  %6.2f  %6.2f  %6s" % (_fmt_time(us), alg, alg * factor, w)


def row(coll, dtype, size, count, root, oop, ip, nranks):
    """oop / ip: (time us, wrong or None) or None when the placement does not exist."""
    f = bus_factor(coll, nranks)
    redop = "sum" if coll in REDUCING else "none"
    print("%12d  %12d  %8s  %6s  %6d  %s  %s" % (
        size, count, dtype, redop, root if coll in ROOTED else -1,
        _placement(oop, size, f), _placement(ip, size, f)), flush=True)
    return (size / 1e3 / oop[0] * f) if oop else (size / 1e3 / ip[0] * f if ip else None)


def footer(coll, wrong_rows, busbws):
    bw = [b for b in busbws if b is not None]
    print("# Out of bounds values : %d %s" % (wrong_rows, "FAILED" if wrong_rows else "OK"))
    print("# Avg bus bandwidth    : %g" % (sum(bw) / len(bw) if bw else 0.0))
    print("#")
    print("# Collective test concluded: %s" % coll, flush=True)


def torch_pattern(torch, ranks, count, offset=0):
    """float32 tensor of elements offset .. offset+count-1 of the sum over `ranks` of each rank's
    input, pattern(r, i) = (i % 29 + 3 r) % 16 (as in mpi_coll_bench.c: small integers, so sums
    are exact in float16 too). The pattern repeats every 29 elements, so it is built by tiling."""
    i = (torch.arange(29, dtype=torch.int32) + offset % 29) % 29
    base = torch.zeros(29, dtype=torch.float32)
    for r in ranks:
        base += ((i + 3 * r) % 16).to(torch.float32)
    return base.repeat(count // 29 + 1)[:count]


HUGE = 2 << 20


def huge_zeros(torch, count, dt, keep):
    """A zeroed tensor of count elements of dt on 2 MiB-aligned anonymous memory advised for huge
    pages before its first touch (when the kernel picks the page size); the mapping goes into
    keep, which must outlive the tensor."""
    esize = torch.tensor([], dtype=dt).element_size()
    n = (count * esize + HUGE - 1) // HUGE * HUGE
    mm = mmap.mmap(-1, n + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    off = (-addr) % HUGE
    if hasattr(mmap, "MADV_HUGEPAGE"):  # only advice: a kernel that refuses it keeps 4 KiB pages
        mm.madvise(mmap.MADV_HUGEPAGE, off, n)
    keep.append(mm)
    return torch.frombuffer(mm, dtype=dt, count=count, offset=off).zero_()


def huge_line():
    """bench_mem.h's line (bench_huge_report), word for word: the kernel's THP mode and this
    process's memory in huge pages; bench/compare.py reads it (HUGE_LINE)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            m = re.search(r"\[(\w+)\]", f.read())
        mode = m.group(1) if m else "?"
    except OSError:
        mode = "?"
    kib = None
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    kib = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    head = "# buffers in transparent huge pages, asked for with madvise (the kernel's mode: %s): " % mode
    return head + ("how much it gave is unknown" if kib is None else "%d MiB of rank 0's memory is in them" % (kib >> 10))


def timed(fn, iters, warmup, barrier):
    """Mean seconds per call of fn() over iters calls after warmup calls, after a barrier."""
    for _ in range(warmup):
        fn()
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def run_sweeps(torch, args, rank, n, root, lib, dtypes, build, sum_all, barrier, label,
               unsupported=(RuntimeError, NotImplementedError)):
    """The sweep every torch-based peer runs: per dtype and collective, warm up at each band's
    largest and smallest size, time every placement, verify, print nccl-tests rows (rank 0).

    build(coll, dname, esize, sbuf, rbuf, req) -> (count, size, {placement: (prep, call, verify)})
    or None; sum_all(x, torch_dtype, name) -> the sum over ranks; label names the library in
    "not supported" lines. Returns the number of rows with wrong elements."""
    maxb = max(b[1] for b in args.bands) + 64
    failed = 0
    for dname in args.dtypes:
        dt = dtypes[dname]
        esize = torch.tensor([], dtype=dt).element_size()
        keep = []
        if args.H:
            sbuf = huge_zeros(torch, maxb // esize, dt, keep)
            rbuf = huge_zeros(torch, maxb // esize, dt, keep)
            if rank == 0:
                print(huge_line(), flush=True)
        else:
            sbuf = torch.zeros(maxb // esize, dtype=dt)
            rbuf = torch.zeros(maxb // esize, dtype=dt)
        for coll in args.coll_list:
            if rank == 0:
                header(coll, dname, lib, n, args)
            bws, wrong_rows = [], 0
            try:
                warmed = False
                for req, iters, warmup, band in sweep(args.bands):
                    if band:  # warm up at the band's largest, then smallest size
                        for wreq in (band[1], band[0]):
                            b = build(coll, dname, esize, sbuf, rbuf, wreq)
                            if b:
                                prep, call, _ = next(iter(b[2].values()))
                                prep()
                                for _ in range(warmup):
                                    call()
                        if b and args.W > 0 and not warmed:  # -W, at the first band's smallest size
                            t0, done = time.perf_counter(), False
                            while not done:
                                call()
                                mine = (time.perf_counter() - t0) * 1e3 >= args.W
                                done = sum_all(1.0 if mine else 0.0, torch.float64, "bench.warm") > 0
                        warmed = True
                    b = build(coll, dname, esize, sbuf, rbuf, req)
                    if b is None:
                        continue
                    count, size, ops = b
                    res = {}
                    for place, (prep, call, verify) in ops.items():
                        prep()
                        sec = timed(call, iters, warmup, barrier)
                        w = None
                        if args.c:
                            prep()
                            call()
                            w = int(sum_all(verify(), torch.int64,
                                            "chk.%s.%s.%d.%s" % (coll, dname, size, place)))
                            if w:
                                wrong_rows += 1
                        res[place] = (sum_all(sec, torch.float64,
                                              "t.%s.%s.%d.%s" % (coll, dname, size, place)) / n * 1e6, w)
                    if rank == 0:
                        bws.append(row(coll, dname, size, count, root, res.get("oop"), res.get("ip"), n))
            except unsupported as e:
                if rank == 0:
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    print("# %s %s: not supported by %s: %s" % (coll, dname, label, msg[:160]), flush=True)
            failed += wrong_rows
            if rank == 0:
                footer(coll, wrong_rows, bws)
    return failed


# ---- a free port for a program that binds it later ----
# (torch's MASTER_PORT in torch_dist_bench.py and bench/train_compare.py, a rendezvous address in
# the tests), taken outside the kernel's ephemeral range (port_window). A port found with
# bind(0) and closed is back in that range, where any socket's bind(0) or connect() can take it
# before the program binds it ("Address already in use"): seen in `make test`, whose C lane's jobs
# open thousands of connections beside the Python lane. Outside the range only a program that
# names the port can.

def port_window():
    """[first, end): up to 16384 ports just below the kernel's ephemeral range, or above it where
    the range starts too low to leave room (ip_local_port_range set to begin near 1024)."""
    low, high = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        pass
    if low - 1024 >= 64:
        return max(1024, low - 16384), low
    return high + 1, 65536


def _bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(pair=False):
    """A port nothing holds (and the next one too with pair), outside the ephemeral range."""
    first, end = port_window()
    rng = random.SystemRandom()
    for _ in range(500 if end - first >= 64 else 0):
        port = rng.randrange(first, end - 1)
        if _bindable(port) and (not pair or _bindable(port + 1)):
            return port
    raise RuntimeError("no free port outside the ephemeral range (tried %d-%d)" % (first, end - 1))
