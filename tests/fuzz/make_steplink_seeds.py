#!/usr/bin/env python3
"""Writes the step-link fuzzer's seeds: streams of frames sealed under its key the way
common/steplink/link_cipher.h seals them (AES-256-GCM; nonce = direction, then the message count,
little-endian; a frame = u32 length of ciphertext + tag, then both), computed here with the
`cryptography` package, independently of the C++ code. Byte 0 of each seed picks the read size."""
import os
import struct
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY = b"\x42" * 32
TO_AGENT = 1


def frame(count, plain, direction=TO_AGENT):
    nonce = struct.pack("<IQ", direction, count)
    sealed = AESGCM(KEY).encrypt(nonce, plain, None)  # ciphertext || 16-byte tag
    return struct.pack("<I", len(sealed)) + sealed


SEEDS = {
    "hello_ack": bytes([0]) + frame(0, b""),
    "three_commands": bytes([7]) + frame(0, b"") + frame(1, b"\x08\x01\x12\x02\x08\x05")
    + frame(2, b"\x08\x02\x1a\x00"),
    "out_of_order": bytes([3]) + frame(1, b"late"),
    "reflected": bytes([1]) + frame(0, b"back", direction=2),
    "length_too_short": bytes([0]) + struct.pack("<I", 15) + b"\x00" * 15,
    "length_too_long": bytes([0]) + struct.pack("<I", 4097),
}

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                             "corpus", "steplink")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {out}")
