#!/usr/bin/env python3
"""Writes the landing-notice fuzzer's seed corpus (landing_notice.h layout; landing_notice_fuzz.cc
records: a length byte and a notice, or 0xff for the batch's immediate)."""
import os
import struct
import sys

MAGIC, VERSION = 0x4E4C4257, 1


def notice(seq, ranges, index=0, count=1):
    # u32 magic | u16 version | u16 entries | u16 index | u16 count | u32 reserved | u64 seq,
    # then per entry u64 step | u64 address | u64 length
    out = struct.pack("<IHHHHIQ", MAGIC, VERSION, len(ranges), index, count, 0, seq)
    for step, addr, length in ranges:
        out += struct.pack("<QQQ", step, addr, length)
    return out


def record(n):
    assert len(n) < 0xFF
    return bytes([len(n)]) + n


CLOSE = b"\xff"
SEEDS = {
    "one_batch": record(notice(1, [(7, 4096, 100), (7, 8192, 50)])) + CLOSE,
    "empty_batch": record(notice(2, [])) + CLOSE,
    "two_notices": record(notice(3, [(1, 0, 8)], 0, 2)) + record(notice(3, [(1, 64, 8)], 1, 2))
    + CLOSE,
    "incomplete_then_next": record(notice(4, [(1, 0, 8)], 0, 2)) + record(notice(5, [(2, 8, 8)]))
    + CLOSE,
    "duplicate": record(notice(6, [(1, 0, 8)])) + record(notice(6, [(1, 0, 8)])) + CLOSE,
    "close_without_notice": CLOSE + CLOSE,
    "wrapping_range": record(notice(7, [(1, (1 << 64) - 4, 8)])) + CLOSE,
}

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/landing_notice"
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
