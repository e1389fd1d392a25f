#!/usr/bin/env python3
"""Writes the manifest fuzzer's seeds: key byte, file name, NUL, manifest bytes.

The signed seed's MAC is computed here with Python's hmac, independently of manifest_mac.cc:
key = HMAC-SHA256(token, "weightbeam storage manifest v1"), MAC = HMAC-SHA256(key, canonical),
canonical = the label line, then each field as "<length>:<value>\\n".
"""
import hashlib
import hmac
import json
import os
import sys

LABEL = "weightbeam storage manifest v1"
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus",
                                                         "manifest")
os.makedirs(out, exist_ok=True)


def canonical(m):
    fields = [m["format"], str(m["version"]), str(m["base_version"]), m["kind"], m["writer"],
              str(len(m["files"]))]
    for f in m["files"]:
        fields += [f["name"], str(f["bytes"]), f["checksum"], f.get("sha256", "")]
    return LABEL + "\n" + "".join("%d:%s\n" % (len(x.encode()), x) for x in fields)


def seed(name, key_byte, file_name, manifest):
    body = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([key_byte]) + file_name.encode() + b"\0" + body)


delta = {"format": "weightbeam-delta/1", "version": 7, "base_version": 6, "kind": "delta",
         "writer": "train-0",
         "files": [{"name": "00000000000000000007.train-0.0.safetensors", "bytes": 4096,
                    "checksum": "0123456789abcdef", "sha256": "ab" * 32},
                   {"name": "00000000000000000007.train-0.1.safetensors", "bytes": 4096,
                    "checksum": "fedcba9876543210", "sha256": "cd" * 32}]}
seed("unsigned-delta", 0, "00000000000000000007.train-0.json", delta)
key = hmac.new(b"fuzz-token", LABEL.encode(), hashlib.sha256).digest()
signed = dict(delta)
signed["mac"] = "hmac-sha256:" + hmac.new(key, canonical(delta).encode(), hashlib.sha256).hexdigest()
seed("signed-delta", 1, "00000000000000000007.train-0.json", signed)
anchor = dict(delta, kind="anchor", base_version=0)
seed("unsigned-anchor", 0, "00000000000000000007.train-0.json", anchor)
seed("version-2p64-plus-1", 0, "18446744073709551617.train-0.json", dict(delta, version=1))
seed("version-25-digits", 0, "0000018446744073709551617.train-0.json", delta)
seed("version-max", 0, "18446744073709551615.train-0.json",
     dict(delta, version=18446744073709551615, files=[
         dict(delta["files"][0], name="18446744073709551615.train-0.0.safetensors")]))
