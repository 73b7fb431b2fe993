#!/usr/bin/env python3
"""fuzz_shm's seeds, in the harness's layout (tests/fuzz/fuzz_shm.c). Run from the repository root."""
import os, struct
D = "tests/fuzz/corpus/fuzz_shm"
BCAST, ALLREDUCE, BARRIER, RAW, SEND = range(5)
RIGHT, BADHDR, BADMARK, RAWB, HEADER, PAYLOAD, HEAD, OWN, CTL, BELL = range(10)
NOTHING, CLOSE, RESET, SILENT = 0, 5, 6, 7
RING = 65536

def u16(v): return struct.pack("<H", v & 0xffff)
def u64(v): return b"".join(u16(v >> s & 0xffff) for s in (48, 32, 16, 0))  # four u16, high first
def span(b): return u16(len(b)) + b

def right(seed=1): return bytes([RIGHT, seed])
def badhdr(what, *args, seed=3): return bytes([BADHDR, what]) + b"".join(args) + bytes([seed])
def badmark(v, seed=2): return bytes([BADMARK]) + u64(v) + bytes([seed])
def rawb(b): return bytes([RAWB]) + span(b)
def header(): return bytes([HEADER])
def payload(seed=4): return bytes([PAYLOAD, seed])
def head(how, v): return bytes([HEAD, how]) + (u64(v) if how == 3 else u16(v))
def own(which, v): return bytes([OWN, which]) + u64(v)
def ctl(closed, reason=b"", junk=0, slot=0, word=0):
    return bytes([CTL, closed]) + (u16(word >> 16) + u16(word) if closed == 3 else b"") + span(reason) \
        + u16(junk >> 16) + u16(junk) + bytes([slot])
def bell(): return bytes([BELL])

# size: L itself, where big (streamed) L = 4097 + u16, and 65536 more with bit 6
def op(kind, size=0, big=False):
    if not big: return bytes([kind]) + u16(size)
    v = size - 4097
    return bytes([kind | 0x80 | (0x40 if v >= 65536 else 0)]) + u16(v % 65536)

# late: the pieces from there on are written after R started (default: none)
def rnd(kind, *ps, size=0, big=False, late=None, e=NOTHING):
    return op(kind, size, big) + bytes([len(ps), len(ps) if late is None else late]) + b"".join(ps) + bytes([e])

def send(size=0, big=False, how=0, k=0, tail=None, e=NOTHING):
    b = op(SEND, size, big) + bytes([how])
    if how == 2: b += u16(k)
    if how in (1, 2): b += u64(tail)
    return b + bytes([e])

seeds = {
    "every_operation_rightly": rnd(BCAST, right(), size=100) + rnd(ALLREDUCE, right(), size=64)
        + rnd(BARRIER, right()) + rnd(RAW, right(), size=33) + send(size=200),
    "inline_limit_and_streamed": rnd(BCAST, right(5), size=4096) + rnd(RAW, right(6), size=(4097), big=True)
        + rnd(BCAST, right(7), size=(40000), big=True),
    "frames_wrap_the_ring": b"".join(rnd(RAW, right(i), size=(20000), big=True) for i in range(8)),
    "header_then_payload_late": rnd(RAW, header(), payload(9), size=(30000), big=True, late=1)
        + rnd(BCAST, right(), rawb(b""), right(), size=500, late=2),
    "streamed_larger_than_the_ring_waits": rnd(RAW, right(), size=(100000), big=True, e=SILENT),
    "send_streamed_past_the_ring": send(size=(131000), big=True) + send(size=(70000), big=True),
    "wrong_magic": rnd(BCAST, badhdr(0, bytes([0, ord("k")])), size=10),
    "length_off_by_one": rnd(BCAST, badhdr(2, bytes([0xff])), size=10),
    "wrong_call_tag": rnd(BCAST, badhdr(4, u16(0x2a40)), size=8),
    "any_tag_on_the_engine_channel": rnd(RAW, badhdr(4, u16(0x2a40)), size=8),
    "single_copy_flag_never_probed": rnd(BCAST, badhdr(6, bytes([0x11])), size=300000 % 4097),
    "abort_and_goodbye_flags": rnd(ALLREDUCE, badhdr(1, u16(0x4000), u16(0)), size=16),
    "garbled_mark": rnd(BCAST, badmark(0x6761726261676521), size=20),
    "zero_mark_then_silence": rnd(BARRIER, badmark(0), e=SILENT),
    "raw_bytes_as_frame": rnd(RAW, rawb(b"\x01" + b"\x00" * 7 + b"KOLM"), size=4),
    "head_beyond_the_ring": rnd(RAW, header(), head(1, 10), size=(100000), big=True),
    # a head 200000 bytes on over a streamed payload longer than two rings: R read past its ring
    "head_past_the_ring_over_a_long_payload": rnd(RAW, header(), head(3, 64 + 200000), size=135000, big=True),
    # ring 0's tail set far ahead while R streams 135000 bytes: R wrote past its ring
    "tail_ahead_while_r_streams": send(size=135000, big=True, how=2, k=100, tail=1 << 40),
    "head_backwards": rnd(RAW, header(), head(2, 100), size=(8000), big=True, e=CLOSE),
    "head_ahead_reads_stale": rnd(RAW, header(), head(0, 9000), size=(5000), big=True)
        + rnd(BCAST, right(), size=10),
    "own_words_garbled": rnd(BCAST, own(0, 0x123457), own(1, (1 << 64) - 3), own(2, 99), right(), size=700)
        + rnd(ALLREDUCE, right(), size=900),
    "own_tail_unaligned_near_the_end": rnd(RAW, own(0, RING - 3), right(), size=50),
    "aborted_with_reason_then_close": rnd(BCAST, ctl(2, b"rank 1 ran out of memory"), size=64, e=CLOSE),
    "abort_reason_not_terminated": rnd(RAW, ctl(2, b"r" * 384), size=64, e=RESET),
    "closed_cleanly_then_close": rnd(BARRIER, ctl(1), e=CLOSE),
    "closed_word_garbage_and_bell": rnd(BCAST, ctl(3, b"x", junk=0xffffffff, slot=200, word=0xdeadbeef), bell(),
                                        size=64, e=SILENT),
    "relayed_abort_reason": rnd(BCAST, ctl(2, b"rank 0 aborted the job because: rank 7 on h (1.2.3.4) aborted the "
                                           b"job because: disk full"), size=8, e=RESET),
    "bell_without_data": rnd(RAW, bell(), bell(), size=8, e=SILENT),
    "close_after_right_frame": rnd(ALLREDUCE, right(), size=12, e=CLOSE) + rnd(RAW, right(), size=12)
        + send(size=40),
    "send_tail_garbled_after": send(size=3000, how=1, tail=(1 << 64) - 1) + rnd(ALLREDUCE, right(), size=64)
        + send(size=(100000), big=True),
    "send_tail_garbled_midway": send(size=(120000), big=True, how=2, k=30000, tail=5 << 20),
    "send_tail_behind": send(size=(120000), big=True, how=2, k=100, tail=0, e=SILENT),
    "send_unread": send(size=(60000), big=True, how=3) + send(size=(60000), big=True),
}

os.makedirs(D, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {D}")
