#!/usr/bin/env python3
"""fuzz_cma's seeds, in the harness's layout (tests/fuzz/fuzz_cma.c). Run from the repository root."""
import os, struct
D = "tests/fuzz/corpus/fuzz_cma"
RECV, BCAST, ROOT, SEND, ALLREDUCE, RSCATTER = range(6)
RING, CMA, BADLEN, ABORTED = 0, 2, 6, 7                       # a message's way
EXACT, MOVED, SHORT, HOLE, BEFORE, FAR = range(6)              # a descriptor's address
A_EXACT, A_SHORT, A_HOLE, A_BEFORE, A_FAR = range(5)           # ROOT's where
ACK, NEVER, ACK_FAR = 0, 2, 3
CLOSE, RESET, SILENT = 0, 1, 2
DL_N, DL_N1, DL_2_48, DL_MAX = range(4)
ARENA = 256 << 10

def u16(v): return struct.pack("<H", v & 0xffff)
def i8(v): return struct.pack("<b", v)
def span(b): return u16(len(b)) + b

def op(kind, size):
    return bytes([kind | (0x80 if size >= 65536 else 0)]) + u16(size % 65536)

def ring(): return bytes([RING])
# misc: & 3 stamp (0, now, 2^64-1, a second on), & 4 the call-chose flag, & 16 (BADLEN) 2^48 + n, >> 5 other flags
def cma(where=EXACT, a=0, d=0, dl=DL_N, misc=0):
    return bytes([CMA, where]) + u16(a) + i8(d) + bytes([dl, misc])
def badlen(e, where=EXACT, misc=0):
    return bytes([BADLEN, where]) + u16(0) + i8(0) + bytes([DL_N, misc]) + i8(e)
def aborted(reason, where=EXACT, a=0):
    return bytes([ABORTED, where]) + u16(a) + i8(0) + bytes([DL_N, 0]) + span(reason)

def recv(size, msg): return op(RECV, size) + msg
def bcast_small(size, msg): return op(BCAST, size) + msg
def bcast(size, first, how, done, e=0, d=0, second=b""):
    return op(BCAST, size) + first + bytes([how]) + u16(e) + i8(d) + done + second
def send(size, want=0, ack=ACK, end=None):
    return op(SEND, size) + bytes([want, ack]) + (bytes([end]) if end is not None else b"")
PID_RIGHT, PID_OTHER, PID_NONE, PID_ZERO = 0, 5, 6, 7
DESC_RIGHT, DESC_BYTES, DESC_NSEG, DESC_LAYOUT = 0, 5, 6, 7
HB_RIGHT, HB_LIE, HB_EFAULT, HB_STATUS = range(4)
# size: 256 KiB + u16; src and dst: ROOT's where kinds, each with its u16
def allreduce(size, pid=PID_RIGHT, desc=DESC_RIGHT, src=(A_EXACT, 0), dst=(A_EXACT, 200000), msg=None,
              hb=None, e=0, who=0, wrote=0, status=None):
    b = bytes([ALLREDUCE]) + u16(size - (256 << 10)) + bytes([pid, desc, src[0]]) + u16(src[1]) \
        + bytes([dst[0]]) + u16(dst[1]) + (msg if msg is not None else ring())
    if hb is not None: b += bytes([hb]) + u16(e) + i8(who) + bytes([wrote]) + (status if status is not None else ring())
    return b

# rank 1's block: 0 read rightly, 1 EFAULT naming member 0, else the errno e naming member `whom`
def rscatter(size, pid=PID_RIGHT, desc=DESC_RIGHT, src=(A_EXACT, 0), msg=None, hb=None, e=0, whom=0, status=None):
    b = bytes([RSCATTER]) + u16(size - (256 << 10)) + bytes([pid, desc, src[0]]) + u16(src[1]) \
        + (msg if msg is not None else ring())
    if hb is not None: b += bytes([hb]) + u16(e) + i8(whom) + (status if status is not None else ring())
    return b

def root(size, want=0, ack=ACK, wk=A_EXACT, a=0, wl=0, d=0, msg=None, end=None):
    b = op(ROOT, size) + bytes([want, ack])
    if size >= 65536: b += bytes([wk]) + u16(a) + bytes([wl]) + i8(d) + (msg if msg is not None else ring())
    return b + (bytes([end]) if end is not None else b"")

seeds = {
    "every_operation_rightly": recv(100, cma()) + recv(5000, ring()) + bcast_small(40000, cma(a=777))
        + send(40000, want=1) + root(50000, want=1) + send(100, want=0xff),
    "receive_single_copy_sizes": recv(0, cma()) + recv(1, cma(a=ARENA - 1)) + recv(4096, cma(a=3))
        + recv(131071, cma(a=9)) + recv(32768, cma(misc=4 | 1)),
    "descriptor_lengths_ignored": recv(1000, cma(dl=DL_N1)) + recv(1000, cma(dl=DL_2_48)) + recv(1000, cma(dl=DL_MAX)),
    "stamps_of_any_time": recv(40000, cma(misc=1)) + recv(40000, cma(misc=2)) + recv(40000, cma(misc=3)),
    "address_moved_inside": recv(3000, cma(MOVED, a=500, d=-17)) + recv(3000, cma(MOVED, a=500, d=100)),
    "address_moved_before_the_arena": recv(3000, cma(MOVED, a=0, d=-1)),
    "address_moved_past_the_arena": recv(3000, cma(MOVED, a=65535, d=127) ) + recv(ARENA % 65536, cma(MOVED, d=1)),
    "buffer_short_by_one": recv(5000, cma(SHORT, a=4999)),
    "buffer_short_by_all": recv(5000, cma(SHORT, a=0)),
    "buffer_exactly_at_the_end": recv(5000, cma(SHORT, a=5000)) + recv(8, cma()),
    "hole_unmapped": recv(64, cma(HOLE, a=100)),
    "guard_before_the_arena": recv(64, cma(BEFORE, a=10)),
    "null_address": recv(64, cma(FAR, a=0)),
    "end_of_user_space": recv(64, cma(FAR, a=2)),
    "address_2_pow_48": recv(64, cma(FAR, a=4)),
    "address_wraps_past_2_pow_64": recv(8192, cma(FAR, a=8)),
    "address_all_ones": recv(64, cma(FAR, a=9)),
    "zero_bytes_at_a_bad_address": recv(0, cma(FAR, a=9)),
    "length_off_by_one": recv(100, badlen(1)),
    "length_2_pow_48_on_the_engine_channel": recv(100, badlen(0, misc=16)),
    "length_2_pow_48_in_a_broadcast": bcast_small(100, badlen(0, misc=16)),
    "aborted_before_a_descriptor": recv(100, aborted(b"rank 1 ran out of memory")),
    "aborted_before_a_bad_descriptor": recv(100, aborted(b"gone", where=HOLE)),
    "ring_frame_after_aborted_mark_then_descriptor": recv(10, ring()) + recv(10, aborted(b"")),
    "split_written": bcast(100000, cma(), 0, ring()),
    "split_unwritten": bcast(100000, cma(), 1, cma(a=5000)),
    "split_second_half_as_message": bcast(131071, ring(), 2, ring(), e=13, second=cma(a=70000)),
    "split_done_length_wrong": bcast(70000, cma(), 3, ring(), d=-1) + recv(10, ring()),
    "split_done_read_moved": bcast(70000, cma(), 0, cma(MOVED, a=100, d=8)),
    "split_first_half_unreadable": op(BCAST, 70000) + cma(HOLE),
    "send_single_copy_each_class": send(32768, want=1) + send(65536, want=2) + send(131071, want=4)
        + send(65535, want=0),
    "send_never_acked_close": send(40000, want=1, ack=NEVER, end=CLOSE),
    "send_never_acked_reset": send(40000, want=1, ack=NEVER, end=RESET),
    "send_never_acked_silence": send(40000, want=1, ack=NEVER, end=SILENT),
    "acks_far_ahead": send(40000, want=1, ack=ACK_FAR) + send(40000, want=1) + root(40000, want=1),
    "root_split_into_the_arena": root(100000, want=0, wk=A_EXACT, a=1234),
    "root_split_where_short": root(100000, want=0xff, wk=A_SHORT, a=1000),
    "root_split_where_in_the_hole": root(100000, wk=A_HOLE, a=7),
    "root_split_where_before_the_arena": root(100000, wk=A_BEFORE, a=100),
    "root_split_where_far": root(70000, wk=A_FAR, a=3) + root(70000, wk=A_FAR, a=8),
    "root_split_where_length_wrong": root(80000, wl=3, d=5) + send(100),
    "root_split_where_by_descriptor": root(90000, wk=A_EXACT, a=40, msg=cma(a=300000 % 65536)),
    "root_split_never_acked": root(100000, ack=NEVER, end=SILENT),
    "allreduce_direct_rightly": allreduce(300000, hb=HB_RIGHT) + allreduce(262144, hb=HB_RIGHT, msg=cma(a=5),
                                                                            status=cma(a=400000 % 65536)),
    "allreduce_peer_did_not_write": allreduce(270000, hb=HB_LIE),
    "allreduce_src_and_dst_overlap": allreduce(280000, src=(A_EXACT, 1000), dst=(A_EXACT, 1000), hb=HB_RIGHT),
    "allreduce_src_in_the_hole": allreduce(262145, src=(A_HOLE, 0), hb=HB_RIGHT),
    "allreduce_src_short": allreduce(262145, src=(A_SHORT, 100), hb=HB_RIGHT),
    "allreduce_dst_short": allreduce(262145, dst=(A_SHORT, 100), hb=HB_RIGHT),
    "allreduce_dst_far": allreduce(262145, dst=(A_FAR, 5), hb=HB_RIGHT),
    "allreduce_desc_of_another_process": allreduce(262144, pid=PID_OTHER, hb=HB_RIGHT),
    "allreduce_desc_of_no_process": allreduce(262144, pid=PID_NONE, hb=HB_RIGHT),
    "allreduce_desc_pid_zero": allreduce(262144, pid=PID_ZERO, hb=HB_RIGHT),
    "allreduce_desc_bytes_wrong": allreduce(262144, desc=DESC_BYTES) + recv(10, ring()),
    "allreduce_desc_layout_wrong": allreduce(262144, desc=DESC_LAYOUT) + allreduce(262144, hb=HB_RIGHT),
    "allreduce_desc_by_bad_descriptor": allreduce(262144, msg=cma(HOLE)),
    "allreduce_peer_says_efault": allreduce(262144, hb=HB_EFAULT),
    "allreduce_status_member_out_of_range": allreduce(262144, hb=HB_STATUS, e=5, who=7),
    "allreduce_status_member_negative": allreduce(262144, hb=HB_STATUS, e=14, who=-100),
    "allreduce_status_gone": allreduce(262144, hb=HB_STATUS, e=3, who=1) + recv(5, ring()),
    "allreduce_status_no_memory": allreduce(262144, hb=HB_STATUS, e=12, who=-1),
    "allreduce_status_other_errno": allreduce(262144, hb=HB_STATUS, e=1, who=0),
    "rscatter_direct_rightly": rscatter(300000, hb=0) + rscatter(262144, hb=0, msg=cma(a=9), status=cma(a=60000)),
    "rscatter_input_short": rscatter(262145, src=(A_SHORT, 4095), hb=0),
    "rscatter_input_far": rscatter(262145, src=(A_FAR, 7), hb=0),
    "rscatter_desc_of_another_process": rscatter(262144, pid=PID_OTHER, hb=0),
    "rscatter_desc_of_no_process": rscatter(262144, pid=PID_NONE, hb=0),
    "rscatter_desc_total_wrong": rscatter(262144, desc=DESC_BYTES) + recv(3, ring()),
    "rscatter_peer_says_efault": rscatter(262144, hb=1),
    "rscatter_status_member_out_of_range": rscatter(262144, hb=2, e=14, whom=2),
    "rscatter_status_member_negative": rscatter(262144, hb=2, e=14, whom=-3),
    "rscatter_status_gone": rscatter(262144, hb=2, e=3, whom=1),
    "rscatter_status_no_memory": rscatter(262144, hb=2, e=12, whom=-1),
    "acks_far_ahead_then_never_acked": send(40000, want=0xff, ack=ACK_FAR) + send(131071, want=3, ack=NEVER, end=CLOSE),
}

os.makedirs(D, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {D}")
