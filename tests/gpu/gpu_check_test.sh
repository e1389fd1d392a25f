#!/usr/bin/env bash
# ./wb gpu-check's verdict before it runs anything, with a fake bazel, gpu_probe and nvidia-smi:
#   - nvidia-smi lists a GPU the CUDA runtime cannot use (driver r550, CUDA 13 runtime): exit 2,
#     with the driver and runtime versions and what to do;
#   - neither sees a GPU: the check list, "no GPU: ..." and exit 0;
#   - --prebuilt DIR builds nothing (bazel here fails if called), runs DIR's probe with DIR/lib on
#     the library path, and refuses a DIR that holds no bundle; a stray argument is refused.
set -uo pipefail
script="$(cd "$(dirname "$0")" && pwd)/gpu_check.sh"
[ -f "$script" ] || script="${TEST_SRCDIR:-.}/weightbeam/tests/gpu/gpu_check.sh"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/repo/tests/gpu" "$root/repo/bazel-bin/tests/gpu" "$root/bin"
cp "$script" "$root/repo/tests/gpu/gpu_check.sh"
printf '#!/bin/sh\nexit 0\n' >"$root/bin/bazel"
cat >"$root/repo/bazel-bin/tests/gpu/gpu_probe" <<'PROBE'
#!/bin/sh
echo "gpus: 0 (no CUDA device (cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version))"
echo "versions: driver supports CUDA 12.4, runtime CUDA 13.0"
exit 4
PROBE
cat >"$root/bin/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-12345678-1234-1234-1234-123456789abc)" ;;
  *driver_version*) echo "550.54.15" ;;
esac
SMI
chmod +x "$root/bin/bazel" "$root/bin/nvidia-smi" "$root/repo/bazel-bin/tests/gpu/gpu_probe"
failed=0
expect() {  # expect WHAT TEXT OUTPUT
  if ! grep -qF -- "$2" <<<"$3"; then
    echo "FAIL: $1: no '$2' in:"
    echo "$3"
    failed=1
  fi
}

out=$(PATH="$root/bin:$PATH" bash "$root/repo/tests/gpu/gpu_check.sh" 2>&1)
rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: GPUs the runtime cannot use: exit $rc, expected 2"; failed=1; }
expect "unusable GPUs" "nvidia-smi lists 1 GPU(s) but this build's CUDA runtime can use none" "$out"
expect "unusable GPUs" "driver: 550.54.15" "$out"
expect "unusable GPUs" "runtime CUDA 13.0" "$out"
expect "unusable GPUs" "r580" "$out"
expect "unusable GPUs" "cuda-compat" "$out"

rm "$root/bin/nvidia-smi"
out=$(PATH="$root/bin:$PATH" bash "$root/repo/tests/gpu/gpu_check.sh" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: no GPU anywhere: exit $rc, expected 0"; failed=1; }
expect "no GPU" "check: cuda-ipc-renumbered" "$out"
expect "no GPU" "no GPU: no CUDA device (cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version); nothing above was run" "$out"
# --prebuilt: a bundle folder with its own probe, which reports the library path it was given.
printf '#!/bin/sh\necho "called bazel" >&2\nexit 1\n' >"$root/bin/bazel"
mkdir -p "$root/repo/bundle/tests/gpu" "$root/repo/bundle/lib"
cat >"$root/repo/bundle/tests/gpu/gpu_probe" <<'PROBE'
#!/bin/sh
echo "gpus: 0 (no CUDA device (bundle probe; LD_LIBRARY_PATH=$LD_LIBRARY_PATH))"
exit 4
PROBE
chmod +x "$root/bin/bazel" "$root/repo/bundle/tests/gpu/gpu_probe"
out=$(cd "$root/repo" && PATH="$root/bin:$PATH" bash tests/gpu/gpu_check.sh --prebuilt bundle 2>&1)
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: --prebuilt without a GPU: exit $rc, expected 0"; failed=1; }
expect "prebuilt" "running the checks prebuilt in bundle (nothing built)" "$out"
expect "prebuilt" "bundle probe; LD_LIBRARY_PATH=$root/repo/bundle/lib" "$out"
if grep -q "called bazel" <<<"$out"; then echo "FAIL: --prebuilt called bazel"; failed=1; fi
out=$(cd "$root/repo" && PATH="$root/bin:$PATH" bash tests/gpu/gpu_check.sh --prebuilt nowhere 2>&1)
rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: --prebuilt of an empty folder: exit $rc, expected 1"; failed=1; }
expect "no bundle" "nowhere holds no bundle" "$out"
out=$(cd "$root/repo" && PATH="$root/bin:$PATH" bash tests/gpu/gpu_check.sh --frobnicate 2>&1)
rc=$?
[ "$rc" -eq 64 ] || { echo "FAIL: an unknown argument: exit $rc, expected 64"; failed=1; }
expect "usage" "usage: gpu_check.sh [--bundle DIR | --prebuilt DIR]" "$out"

[ "$failed" -eq 0 ] && echo "gpu-check verdicts: ok"
exit $failed
