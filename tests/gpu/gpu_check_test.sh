#!/usr/bin/env bash
# ./wb gpu-check's verdict before it runs anything, with a fake bazel, gpu_probe and nvidia-smi:
#   - nvidia-smi lists a GPU the CUDA runtime cannot use (driver r550, CUDA 13 runtime): exit 2,
#     with the driver and runtime versions and what to do;
#   - neither sees a GPU: the check list, "no GPU: ..." and exit 0.
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
[ "$failed" -eq 0 ] && echo "gpu-check verdicts: ok"
exit $failed
