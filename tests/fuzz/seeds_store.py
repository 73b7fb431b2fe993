#!/usr/bin/env python3
"""fuzz_store's seeds, in the harness's layout (tests/fuzz/fuzz_store.c). Run from the repository root."""
import os, struct
D = "tests/fuzz/corpus/fuzz_store"
OPEN, STRANGER, SELECT, FRAMES, RAW, TWEAK, CLOSE, PAUSE = range(8)
SET, GET, ADD, UNK = range(4)

def span(b): return struct.pack("<H", len(b)) + b
def key(k): return bytes([len(k)]) + k
def fset(k, v): return bytes([SET]) + key(k) + span(v)
def fget(k, w): return bytes([GET]) + key(k) + bytes([w])
def fadd(k, d): return bytes([ADD]) + key(k) + (bytes([d + 64]) if -64 <= d < 64 else b"\x80" + struct.pack(">q", d))
def funk(k, body): return bytes([UNK]) + key(k) + span(body)
def frames(*fs): return bytes([FRAMES, len(fs) - 1]) + b"".join(fs)
def wire(op, k, body): return struct.pack(">I", 2 + len(k) + len(body)) + bytes([op, len(k)]) + k + body

seeds = {
    "stranger_greeting_wrong_proof": b"\x00" + b"KOLOSTv1" + bytes(range(32)) + b"\x11" * 32,
    "stranger_http": b"\x00GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "stranger_half_greeting": b"\x00KOLOST",
    "set_get_add": b"\x01" + bytes([OPEN, 0])
        + frames(fset(b"a", b"hello"), fget(b"a", 0), fadd(b"n", 1), fget(b"zz", 5)),
    "add_counter_overflow": b"\x01" + bytes([OPEN, 0])
        + frames(fadd(b"c", 2**63 - 1), fadd(b"c", 1), fset(b"t", b"-12"), fadd(b"t", -5)),
    "get_parked_woken": b"\x01" + bytes([OPEN, 0, OPEN, 1, 7]) + bytes([SELECT, 0]) + frames(fget(b"w", 0xc0))
        + bytes([SELECT, 1]) + frames(fset(b"w", b"woke")) + bytes([SELECT, 0]) + frames(fget(b"w", 0)),
    "get_parked_closed": b"\x01" + bytes([OPEN, 0]) + frames(fget(b"never", 0xc4)) + bytes([CLOSE, 0]),
    "frame_truncated": b"\x01" + bytes([OPEN, 0]) + fset(b"k", b"value")[:0] + bytes([TWEAK]) + fset(b"k", b"value")
        + bytes([0, 3]) + bytes([CLOSE, 1]),
    "frame_length_out_of_range": b"\x01" + bytes([OPEN, 0]) + bytes([RAW]) + span(struct.pack(">I", 1) + b"\x01"),
    "frame_pipelined_raw": b"\x01" + bytes([OPEN, 0]) + bytes([RAW])
        + span(wire(1, b"p", b"x") + wire(2, b"p", b"\0\0\0\0")
        + wire(3, b"p", b"\0" * 8)[:7]) + bytes([RAW]) + span(wire(3, b"p", b"\0" * 8)[7:] + wire(1, b"q", b"")),
    "unknown_op": b"\x01" + bytes([OPEN, 0]) + frames(fset(b"u", b"1"), funk(b"u", b"zz")),
    "key_length_zero": b"\x01" + bytes([OPEN, 0]) + frames(fset(b"", b"v")),
    "handshake_variants": b"\x01" + bytes([OPEN, 1, 20, OPEN, 2, 5, OPEN, 3, STRANGER, 1]) + span(b"KOLOSTv1")
        + bytes([STRANGER, 0]) + span(b"junk") + frames(fset(b"h", b"ok")),
    "set_value_over_16mib": b"\x01" + bytes([OPEN, 0, TWEAK]) + fset(b"b", b"") + bytes([0xff, 0, 255]),
    "set_value_16mib_exactly": b"\x01" + bytes([OPEN, 0, TWEAK]) + fset(b"b", b"") + bytes([0xff, 0, 4]),
}
os.makedirs(D, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
MANY, FLOOD = 8, 9
extra = {
    "many_keys_table_grows": b"\x01" + bytes([OPEN, 0, MANY, 80]) + span(b"m") + frames(fget(b"m\x00\x05", 0)),
    "flood_unread_answers": b"\x01" + bytes([OPEN, 0, FLOOD, 15, 1]) + b"f" + frames(fset(b"after", b"x")),
}
for name, data in extra.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
more = {
    "get_parked_pipelined": b"\x01" + bytes([OPEN, 0]) + frames(fset(b"x", b"1"))
        + frames(fget(b"w", 0xe8), fget(b"x", 0), fget(b"nope", 0), fset(b"late", b"z"))
        + bytes([SELECT, 1]) + frames(fset(b"w", b"v"), fset(b"x", b"2"))
        + bytes([SELECT, 0]) + frames(fget(b"late", 0)),
}
for name, data in more.items():
    with open(os.path.join(D, name), "wb") as f:
        f.write(data)
