#!/usr/bin/env python3
"""Writes the frame fuzzer's seed corpus: one valid header of each type (frame.h layout)."""
import os
import struct
import sys

MAGIC, VERSION = 0x46544257, 2


def frame(ftype, aux=0, region=0, key=0, offset=0, length=0, batch=0, payload=b"", step=0):
    # u32 magic | u8 version | u8 type | u16 flags | u32 aux | u32 reserved | 6 x u64 (the
    # last: the step id, version 2)
    return struct.pack("<IBBHII6Q", MAGIC, VERSION, ftype, 0, aux, 0, region, key, offset,
                       length, batch, step) + payload


SEEDS = {
    "hello": frame(1, length=12, payload=b"\x0a\x04tok1\x12\x04node"),
    "write": frame(2, region=3, key=0x1234567890ABCDEF, offset=4096, length=65536, batch=7,
                   step=0x0123456789ABCDEF),
    "write_at_end": frame(2, region=1, key=1, offset=(1 << 64) - 2, length=1, batch=1),
    # frame_fuzz registers region 1 (4096 B destination), 2 (1 B destination), 3 (64 B source);
    # key 0 stands for the region's real key there.
    "write_region1_whole": frame(2, region=1, key=0, offset=0, length=4096, batch=2),
    "write_region1_last_byte": frame(2, region=1, key=0, offset=4095, length=1, batch=2),
    "write_region2": frame(2, region=2, key=0, offset=0, length=1, batch=3),
    "write_source_region": frame(2, region=3, key=0, offset=0, length=8, batch=3),
    "flush": frame(3, aux=4, offset=262144, batch=7),
    "ack": frame(4, batch=7),
    "nack": frame(5, length=9, batch=7, payload=b"bad key!!"),
}

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus",
                                                         "frame")
os.makedirs(out, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(out, name + ".bin"), "wb") as f:
        f.write(data)
