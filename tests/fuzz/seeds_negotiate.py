#!/usr/bin/env python3
"""Writes fuzz_negotiate's seeds (tests/fuzz/corpus/fuzz_negotiate/): real negotiations, each an
input in the harness's layout (fuzz_negotiate.c), from which the fuzzer garbles its way. Run from
the repository root; rewrites the seeds it names, leaves the others (kept crashes) alone."""
import os
import struct

ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER = range(5)
FLOAT32, FLOAT64 = 8, 9
SUM, AVERAGE = 0, 1
CAPS = [0, 1, 64, 100]
JOINED = 1
REC_DESC, REC_STALL = 1, 2


def desc(name, kind=ALLREDUCE, dtype=FLOAT32, op=SUM, dims=(4, 3), root=0, device="", splits=None):
    b = struct.pack("<5Bidd", REC_DESC, kind, dtype, op, len(dims), root, 1.0, 1.0)
    b += b"".join(struct.pack("<q", d) for d in dims)
    b += struct.pack("<B", len(device)) + device.encode()
    n = name.encode() + b"\0"
    b += struct.pack("<H", len(n)) + n
    if splits is not None:
        b += b"".join(struct.pack("<q", s) for s in splits)
    return b


def stall(name):
    n = name.encode() + b"\0"
    return struct.pack("<BH", REC_STALL, len(n)) + n


def seed(n, me, cap, cycles, clocks=0):
    """cycles: per cycle, per rank (flags, set of cache slots, variable part)."""
    words = (cap + 63) // 64
    out = struct.pack("<5B", n - 2, me, CAPS.index(cap), clocks, len(cycles) - 1)
    for ranks in cycles:
        assert len(ranks) == n
        for flags, slots, var in ranks:
            bits = bytearray(words * 8)
            for s in slots:
                bits[s // 8] |= 1 << (s % 8)
            out += struct.pack("<B", flags) + bytes(bits) + struct.pack("<H", len(var)) + var
    return out


SEEDS = {
    # described, then cached: the steady state
    "allreduce_then_cached": seed(2, 0, 64, [
        [(0, (), desc("grad.w")), (0, (), desc("grad.w"))],
        [(0, (0,), b""), (0, (0,), b"")],
    ]),
    # the ranks disagree on the dtype: an error response naming both
    "dtype_mismatch": seed(2, 1, 64, [
        [(0, (), desc("grad.b", dtype=FLOAT32)), (0, (), desc("grad.b", dtype=FLOAT64))],
    ]),
    "allgather_three_ranks": seed(3, 2, 64, [
        [(0, (), desc("ag", kind=ALLGATHER, dims=(r + 1, 5))) for r in range(3)],
        [(0, (0,), b"") for r in range(3)],
    ]),
    "alltoall_splits": seed(3, 0, 64, [
        [(0, (), desc("a2a", kind=ALLTOALL, dims=(6,), splits=(2, 2, 2))) for r in range(3)],
    ]),
    "broadcast_and_reducescatter": seed(4, 3, 100, [
        [(0, (), desc("bc", kind=BROADCAST, root=2) + desc("rs", kind=REDUCESCATTER, dims=(8, 2), op=AVERAGE))
         for r in range(4)],
        [(0, (0, 1), b"") for r in range(4)],
        [(0, (1,), b"") for r in range(4)],
    ]),
    # one rank late with a name, the coordinator calling it stalled; a rank that joined
    "stall_and_join": seed(3, 0, 64, [
        [(0, (), desc("late")), (0, (), desc("late")), (JOINED, (), b"")],
        [(0, (), stall("late")), (0, (), b""), (JOINED, (), b"")],
    ], clocks=3),
    # five ranks, a cache of 100 slots: the last word's bits past 100 name no slot
    "bits_past_the_cache": seed(5, 4, 100, [
        [(0, (), desc("g%d" % i)) for i in range(5)][:0] + [(0, (), desc("x")) for r in range(5)],
        [(0, (0, 101, 127), b"") for r in range(5)],
    ]),
    "no_cache": seed(2, 0, 0, [
        [(0, (), desc("nc", device="cpu")), (0, (), desc("nc", device="cpu"))],
        [(0, (), desc("nc", device="cpu")), (0, (), desc("nc", device="cpu"))],
    ]),
}

if __name__ == "__main__":
    d = "tests/fuzz/corpus/fuzz_negotiate"
    os.makedirs(d, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), d))
