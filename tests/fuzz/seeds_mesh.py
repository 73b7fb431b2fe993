#!/usr/bin/env python3
"""fuzz_mesh's seeds, in the harness's layout (tests/fuzz/fuzz_mesh.c). Run from the repository root."""
import os, struct
D = "tests/fuzz/corpus/fuzz_mesh"
STRANGER, CONNECT, RESULT, ACCEPT, PAUSE = range(5)
HALF, CLOSE, RESET, SILENT = range(4)

def span(b): return struct.pack("<H", len(b)) + b
def shape(size, rank, same_host=()):
    return bytes([(size - 2) | rank << 1 | sum(1 << (4 + q) for q in same_host)])
def stranger(raw, read_greeting=False, end=HALF): return bytes([STRANGER, int(read_greeting) | end << 1]) + span(raw)
def connect(rank, ch, mut=0, *args): return bytes([CONNECT, rank, ch, mut]) + bytes(args)
def connect_wide(rank, ch, mut=0):  # rank and channel as u32 (two u16, high first)
    return bytes([CONNECT, 0x80, 0x80, mut]) + struct.pack("<HH", rank >> 16, rank & 0xffff) \
        + struct.pack("<HH", ch >> 16, ch & 0xffff)
def pipelined(rank, ch, extra): return bytes([CONNECT, rank, ch, 18]) + span(extra)  # 18 % 9 == 0, bit 4 set
def result(pick=0, taken=0, cma=0, probe=0, tail=b""):
    return bytes([RESULT, pick, taken | cma << 2 | probe << 4]) + span(tail)
def result_cut(pick, cut, reset=False): return bytes([RESULT, pick, 64 | (128 if reset else 0), cut])
def accept(rank, mut=0, *args): return bytes([ACCEPT, rank, mut]) + bytes(args)
def accept_right(rank=0, ack=0, offer=0, final=0, name=None):
    return bytes([ACCEPT, rank, 0, ack, offer]) + (span(name) if name is not None else b"") + bytes([final])

seeds = {
    "two_ranks_rank0_undisturbed": shape(2, 0),
    "three_ranks_rank1_one_host": shape(3, 1, (0, 2)),
    "strangers_http_silent_reset": shape(2, 0) + stranger(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        + stranger(b"", True, SILENT) + stranger(b"KOLOMSH6", False, RESET) + stranger(b"x" * 120, True),
    "greetings_wrong_version_and_macs": shape(2, 0) + connect(1, 0, 1, ord("1")) + connect(1, 0, 1, 1)
        + connect(1, 0, 3, 77) + connect(1, 0, 4) + connect(1, 0, 5) + connect(1, 0, 6) + connect(1, 0, 7)
        + connect(1, 0, 2) + b"KOLOMSH5",
    "greeting_duplicate_pair": shape(2, 0) + connect(1, 1) + result(0) + connect(1, 1) + connect(1, 0) + connect(1, 0),
    "greeting_ranks_channels_out_of_range": shape(3, 1) + connect(0, 0) + connect(1, 0) + connect(3, 1)
        + connect(2, 2) + connect_wide(0xffffffff, 0) + connect_wide(2, 0x80000001),
    "greeting_truncated_each_end": shape(2, 0) + connect(1, 0, 8, 79, HALF) + connect(1, 0, 8, 12, CLOSE)
        + connect(1, 0, 8, 40, RESET) + connect(1, 0, 8, 3, SILENT),
    "result_pipelined_and_trailing": shape(3, 0) + pipelined(1, 0, bytes(24) + b"trailing")
        + pipelined(2, 1, b"\1\0\0\0") + result(0, 1, 1, 0, b"after the handshake"),
    "result_hangs_up": shape(2, 0) + connect(1, 0) + result_cut(0, 10),
    "result_reset_before_any": shape(2, 0) + connect(1, 1) + result_cut(0, 0, True),
    "shm_offered_cma_probes": shape(2, 0, (1,)) + connect(1, 0) + result(0, 1, 1, 0) + connect(1, 1)
        + result(0, 1, 0, 3),
    "shm_offered_declined_wrong_probe": shape(3, 0, (1, 2)) + connect(1, 0) + result(0, 0, 1, 0)
        + connect(2, 0) + result(0, 1, 1, 1),
    "acceptor_other_version": shape(2, 1) + accept(0, 1, ord("5")),
    "acceptor_wrong_magic": shape(2, 1) + accept(0, 2),
    "acceptor_wrong_rank": shape(3, 2) + accept(1, 3, 0),
    "acceptor_greeting_truncated": shape(2, 1) + accept(0, 4, 20),
    "acceptor_hangs_up_at_once": shape(2, 1) + accept(0, 5),
    "acceptor_hangs_up_after_greeting": shape(2, 1) + accept(0, 6),
    "acceptance_mac_flipped": shape(2, 1) + accept(0, 0, 1, 0, 5),
    "acceptance_connect_label": shape(2, 1) + accept(0, 0, 2, 0),
    "acceptance_truncated": shape(3, 2) + accept_right(0) + accept(1, 0, 4, 0, 100),
    "acceptance_offers_missing_segments": shape(3, 2, (0, 1)) + accept_right(0, offer=1, final=1, name=b"/kolo-nope")
        + accept_right(0, offer=2, final=0) + accept_right(1, offer=1, name=b"A" * 96)
        + bytes([ACCEPT, 1, 0, 0, 3]) + struct.pack("<HH", 0, 7) + span(b"../../etc/passwd") + b"\x02"
        + struct.pack("<HH", 1, 2),
    "acceptor_final_cut": shape(2, 1) + accept_right(0, final=3) + b"\x02",
    "both_sides_with_strangers": shape(3, 1, (2,)) + stranger(b"\0" * 80) + accept_right(0) + connect(2, 0)
        + stranger(b"KOLOMSH6", True, SILENT) + bytes([PAUSE, 3]) + result(0, 1, 0, 0) + accept_right(0),
}
os.makedirs(D, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
