#!/usr/bin/env python3
"""Writes the config fuzzer's focused-mode seeds: 0xFF, template index, a valid boundary value.

The template order is kTemplates in config_fuzz.cc; keep the two lists in step.
"""
import os
import sys

VALUES = [
    "node-0", "info", "0660", "0.0.0.0:7101", "127.0.0.1:7100", "600000", "0.0.0.0:9100",
    "0.0.0.0:0", "64", "4GiB", "true", "[mlx5_0, mlx5_1]", "255", "64", "4096", "16384",
    "2147483648", "1099511627776", "3600000", "64", "k.pem", "ca.pem",
    "3600000", "3600000", "3600000", "1048576", "1048576", "1048576", "'^_orig_mod\\.(.*)$'",
    "[a, b]", "7", "0.001", "1000000",
]

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus",
                                                         "config")
os.makedirs(out, exist_ok=True)
for index, value in enumerate(VALUES):
    with open(os.path.join(out, "focused-%02d.bin" % index), "wb") as f:
        f.write(bytes([0xFF, index]) + value.encode())
