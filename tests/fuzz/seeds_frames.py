#!/usr/bin/env python3
"""fuzz_frames's seeds, in the harness's layout (tests/fuzz/fuzz_frames.c). Run from the repository root."""
import os, struct
D = "tests/fuzz/corpus/fuzz_frames"
BCAST, ALLREDUCE, ALLGATHER, BARRIER, RAW = range(5)
RIGHT, FILLER, BADHDR, GOODBYE, ABORT, RAWB, HEADER, PAYLOAD = range(8)
NOTHING, CLOSE, RESET, SILENT = 0, 5, 6, 7

def u16(v): return struct.pack("<H", v)
def u64(v): return b"".join(u16(v >> s & 0xffff) for s in (48, 32, 16, 0))  # four u16, high first
def span(b): return u16(len(b)) + b

def op(kind, size=0, big=False, theirs=None):
    b = bytes([kind | (0x80 if big else 0)]) + u16(size)
    return b + (u16(theirs) if kind == ALLGATHER else b"")
def right(seed=1): return bytes([RIGHT, seed])
def filler(before, after, seed=2): return bytes([FILLER]) + u16(before) + u16(after) + bytes([seed])
def badhdr(what, *args, seed=3): return bytes([BADHDR, what]) + b"".join(args) + bytes([seed])
def goodbye(extra=0, length=0): return bytes([GOODBYE, extra]) + u16(length)
def abort(reason, field=None):
    return bytes([ABORT, 1 if field is not None else 0]) + (u64(field) if field is not None else b"") + span(reason)
def rawb(b): return bytes([RAWB]) + span(b)
def header(): return bytes([HEADER])
def payload(seed=4): return bytes([PAYLOAD, seed])
def pieces(*ps): return bytes([len(ps)]) + b"".join(ps)
AT_ONCE = bytes([0])
def in_steps(step): return bytes([1, step - 1])
def cut_at(k): return bytes([2]) + u16(k)
BYTEWISE = bytes([3])
def end(e): return bytes([e])

def rnd(kind, *ps, size=0, big=False, theirs=None, write=AT_ONCE, e=NOTHING):
    return op(kind, size, big, theirs) + pieces(*ps) + write + end(e)

seeds = {
    "every_operation_rightly": rnd(BCAST, right(), size=100) + rnd(ALLREDUCE, right(), size=64)
        + rnd(ALLGATHER, right(), size=5, theirs=9) + rnd(BARRIER, right()) + rnd(RAW, right(), size=33),
    "large_frames_with_filler": rnd(BCAST, filler(4095, 17), size=2048, big=True, write=in_steps(7))
        + rnd(RAW, filler(0, 0), size=2047, big=True, write=cut_at(20000)),
    "filler_on_a_short_frame": rnd(BCAST, filler(8, 0), size=500),
    "header_and_payload_apart": rnd(ALLREDUCE, header(), rawb(b""), payload(), size=300, write=BYTEWISE)
        + rnd(BCAST, header(), payload(), size=3000, big=True, write=cut_at(9)),
    "wrong_magic": rnd(BCAST, badhdr(0, bytes([0, ord("k")])), size=10),
    "length_off_by_one_and_2_48": rnd(BCAST, badhdr(2, bytes([0xff])), size=10)
        + rnd(BCAST, badhdr(5), size=10),
    "length_field_huge": rnd(RAW, badhdr(3, u16(0xffff), u16(0xffff), u16(0xffff), u16(0xfff0)), size=16),
    "wrong_call_tag": rnd(BCAST, badhdr(4, u16(0x2a40)), size=8),
    "any_tag_on_the_engine_channel": rnd(RAW, badhdr(4, u16(0x2a40)), size=8),
    "flags_garbage": rnd(ALLGATHER, badhdr(1, u16(0x1234), u16(0x5678)), size=3, theirs=3),
    "goodbye_with_length": rnd(BARRIER, goodbye(0x12, 999)),
    "abort_with_reason": rnd(ALLREDUCE, abort(b"rank 7 on h (1.2.3.4) aborted the job because: out of memory"),
                             size=1000),
    "abort_reason_longer_than_384": rnd(BCAST, abort(b"x" * 400, field=1 << 40), size=200000 % 4096, big=True),
    # "KOLM" in the wrong order, and " gar" as flags has the ABORT bit: see the top of fuzz_frames.c
    "trailing_garbage_then_next_call": rnd(BCAST, right(), rawb(b"KOLM garbage"), size=40)
        + rnd(BCAST, right(), size=40),
    "close_mid_frame": rnd(BCAST, header(), rawb(b"abc"), size=50, e=CLOSE) + rnd(BCAST, right(), size=50),
    "reset_mid_frame": rnd(RAW, header(), size=50, e=RESET),
    "silent_mid_frame": rnd(BARRIER, rawb(b"KOLM"), e=SILENT),
    "close_after_right_frame": rnd(ALLREDUCE, right(), size=12, e=CLOSE) + rnd(RAW, right(), size=12),
}

os.makedirs(D, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {D}")
