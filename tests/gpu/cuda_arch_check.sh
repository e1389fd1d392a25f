#!/usr/bin/env bash
# The architectures every cuda_library archive carries (tools/cuda.bzl): SASS (ELF) for sm_80
# and sm_90, and compute_90 PTX, which the driver JIT-compiles for GPUs newer than the SASS (a
# Blackwell GPU cannot load a kernel without it). Read from each object's .nv_fatbin section
# (objcopy; the fat binary's entry headers give kind and architecture), so no cuobjdump needed.
# $@: the archives (none in a build without CUDA: nothing to check).
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "no CUDA archives in this build (HAVE_CUDA False): nothing to check"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
for a in "$@"; do
  rm -rf "$tmp"/*
  (cd "$tmp" && ar x "$OLDPWD/$a")
  for o in "$tmp"/*.o; do
    objcopy -O binary --only-section=.nv_fatbin "$o" "$o.fatbin"
  done
  # One line per object: "ptx:90 elf:80 elf:90" (sorted, unique).
  found=$(python3 - "$tmp"/*.fatbin <<'PY'
import struct, sys
kinds = {1: "ptx", 2: "elf"}
for path in sys.argv[1:]:
    d, off, seen = open(path, "rb").read(), 0, set()
    while off + 16 <= len(d):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", d, off)
        if magic != 0xBA55ED50:  # fat binary header
            break
        p, end = off + hsize, off + hsize + fsize
        while p < end:
            kind, _, ehsize, size = struct.unpack_from("<HHIQ", d, p)
            arch = struct.unpack_from("<I", d, p + 28)[0]
            seen.add("%s:%d" % (kinds.get(kind, "kind%d" % kind), arch))
            p += ehsize + size
        off = end
    print(" ".join(sorted(seen)))
PY
)
  while read -r line; do
    for want in elf:80 elf:90 ptx:90; do
      if ! grep -qw "$want" <<<"$line"; then
        echo "FAIL: $(basename "$a"): no $want (elf:N = sm_N SASS, ptx:N = compute_N PTX; has: $line)"
        failed=1
      fi
    done
  done <<<"$found"
  echo "$(basename "$a"): $(sort -u <<<"$found" | paste -sd';')"
done
exit $failed
