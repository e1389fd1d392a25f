#!/usr/bin/env bash
# ./wb gpu-check: builds with CUDA, then runs every GPU test and benchmark and prints one table
# (check, result, figure). Without a GPU it builds, lists the checks (one `check:` line each),
# says why there is no GPU and exits 0. When nvidia-smi lists GPUs that the CUDA runtime of this
# build cannot use (a driver older than the runtime needs, most often), it fails loudly with
# the driver and runtime versions and exits 2. On a GPU machine run it first; paste its table
# into the closing note (docs/gpu.md).
#
# A GPU machine without the build's packages (no Bazel, no gRPC): on a build machine
#   ./wb gpu-check --bundle DIR     builds, copies every check's binary, runfiles and the
#                                   shared libraries a CUDA image lacks into DIR
# then, in a checkout on the GPU machine,
#   ./wb gpu-check --prebuilt DIR   runs the same checks from DIR, building nothing.
set -uo pipefail
cd "$(dirname "$0")/../.."
log() { printf '\033[1m[wb]\033[0m %s\n' "$*" >&2; }
BAZEL_FLAGS=(--jobs=2)
BIN=bazel-bin
MODE=check
case "${1:-}" in
  --bundle | --prebuilt)
    [ $# -eq 2 ] || { log "usage: gpu_check.sh [--bundle DIR | --prebuilt DIR]"; exit 64; }
    MODE=${1#--}
    BIN=$2
    ;;
  "") ;;
  *) log "usage: gpu_check.sh [--bundle DIR | --prebuilt DIR]"; exit 64 ;;
esac

# name | what it proves
CHECKS=(
  "cuda-build|every .cu file compiled with nvcc (no stand-ins); devices listed"
  "staging-host|staging pipeline, kernel geometry and executor GPU-source host tests (no GPU needed)"
  "transform-kernels|CUDA transforms bit-exact with the CPU (golden + random); GB/s, % of HBM"
  "gpus-visible|the CUDA runtime sees every GPU nvidia-smi lists (driver new enough)"
  "cuda-ipc|CUDA IPC: a handle exported here opened in another process (device found by UUID)"
  "cuda-ipc-renumbered|the same, the other process seeing the GPUs in another order (2+ GPUs)"
  "python-cuda-ipc|the Python client's export opened by the C++ side; cudaMallocAsync refused"
  "dma-buf|the driver exports device memory as dma-buf (rdma GPUDirect path)"
  "delta-encode|GPU delta encode bit-identical to the CPU codec; GB/s, % of HBM, both shadows"
  "delta-scatter|GPU delta scatter equal to the host apply; GB/s"
  "transport-tcp-gpu|transport suite, tcp, GPU source/destination regions (pinned staging)"
  "transport-local-gpu|transport suite, local, GPU regions (CUDA driver copies)"
  "transport-rdma-gpu|transport suite, rdma, GPU regions (dma-buf or nvidia-peermem), where an RDMA device exists"
  "demo-gpu|end-to-end demo with GPU buffers on both sides (wb-demo --gpu, dense and --delta)"
  "capture-overwrite|a 1 GiB CUDA source overwritten (device to device) the moment step_captured returns: every received byte equals the snapshot (issue 41, item 1)"
  "demo-gpu-nowait|the same with capture (device-to-device into the agent's GPU memory) and staged receive (GPU mirrors, swapped at commit): wb-demo --gpu --capture --staged"
)

TEST_TARGETS=(
  //tests/gpu:cuda_build_check //tests/gpu:staging_pipeline_test //tests/gpu:delta_gpu_host_test
  //tests/gpu:delta_gpu_encode_test //tests/transform:transform_cuda_test
  //tests/transform:gpu_helpers_test //tests/transform:delta_gpu_test
  //tests/executor:gpu_source_test //tests/gpu:capture_overwrite_test
)
BIN_TARGETS=(
  //tests/gpu:gpu_probe //tests/gpu:dmabuf_probe //tests/bench:transform_bench
  //tests/bench:delta_scatter_bench //tests/bench:delta_encode_gpu_bench
  //tests/transport:transport_suite //tests/demo:wb-demo //daemon:wb-agent //controller:wb-controller
  //tests/transform:ipc_open_helper //client/python:stubs
)

build() {
  log "building the GPU tests and benchmarks with CUDA"
  if ! bazel build "${BAZEL_FLAGS[@]}" "${TEST_TARGETS[@]}" "${BIN_TARGETS[@]}" >&2; then
    log "gpu-check: build FAILED"
    exit 1
  fi
  # The build must be a CUDA build wherever nvcc exists (the stand-ins would pass every "skip").
  if ! bazel test "${BAZEL_FLAGS[@]}" //tests/gpu:cuda_build_check >&2; then
    log "gpu-check: FAILED: nvcc is installed but the build used the no-CUDA stand-ins"
    exit 1
  fi
}

# bundle DIR: each target's binary (and runfiles) at its bazel-bin path, stripped, plus in
# DIR/lib the shared libraries it links that are not the C library, the compiler's runtime or
# the driver (a CUDA image has those; it has no gRPC, protobuf, spdlog, yaml-cpp or verbs).
bundle() {
  local dir=$1 t path elves=()
  rm -rf "$dir" && mkdir -p "$dir/lib" || exit 1
  for t in "${TEST_TARGETS[@]}" "${BIN_TARGETS[@]}"; do
    [ "$t" = //client/python:stubs ] && continue
    path=${t#//}
    path=${path/://}
    mkdir -p "$dir/$(dirname "$path")"
    cp -L "bazel-bin/$path" "$dir/$path" || exit 1
    elves+=("bazel-bin/$path")
    strip --strip-unneeded "$dir/$path" 2>/dev/null  # scripts (sh_test) stay as they are
    # Runfiles only where they hold data beyond the binary itself and its libraries (the
    # helper that gpu_helpers_test starts).
    local extra
    extra=$(cd "bazel-bin/$path.runfiles" 2>/dev/null && find . -path ./weightbeam/_solib_k8 -prune -o \
      -type f,l -not -name MANIFEST -not -path "./weightbeam/$path" -print)
    if [ -n "$extra" ]; then
      for f in $extra; do
        mkdir -p "$dir/$path.runfiles/$(dirname "$f")"
        cp -L "bazel-bin/$path.runfiles/$f" "$dir/$path.runfiles/$f" || exit 1
        elves+=("bazel-bin/$path.runfiles/$f")
        strip --strip-unneeded "$dir/$path.runfiles/$f" 2>/dev/null
      done
    fi
  done
  mkdir -p "$dir/client/python/weightbeam"
  cp -rL bazel-bin/client/python/weightbeam/v1 "$dir/client/python/weightbeam/" || exit 1
  # ldd on the originals: their RUNPATH finds Bazel's own libraries (_solib_k8) from bazel-bin.
  ldd "${elves[@]}" 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libnvidia[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  if ldd "${elves[@]}" 2>/dev/null | grep -q "not found"; then
    log "bundle: a library is missing: $(ldd "${elves[@]}" 2>/dev/null | grep "not found" | sort -u | head -3)"
    exit 1
  fi
  log "bundle: $(du -sh "$dir" | cut -f1) in $dir; on the GPU machine: ./wb gpu-check --prebuilt $dir"
}

case $MODE in
  check) build ;;
  bundle) build; bundle "$BIN"; exit 0 ;;
  prebuilt)
    [ -x "$BIN/tests/gpu/gpu_probe" ] || { log "gpu-check: $BIN holds no bundle (./wb gpu-check --bundle)"; exit 1; }
    export LD_LIBRARY_PATH="$(cd "$BIN" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "gpu-check: running the checks prebuilt in $BIN (nothing built)"
    ;;
esac

probe=$(timeout 60 $BIN/tests/gpu/gpu_probe)
probe_rc=$?
# What the driver itself lists: GPUs the runtime cannot use must not pass for "no GPU".
smi_gpus=0
smi_driver=""
smi_mig=0
if command -v nvidia-smi >/dev/null 2>&1; then
  smi_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  smi_mig=$(nvidia-smi -L 2>/dev/null | grep -c 'MIG ')
  smi_driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
fi
versions=$(sed -n 's/^versions: //p' <<<"$probe")
if [ "$probe_rc" -ne 0 ]; then
  if [ "$smi_gpus" -gt 0 ]; then
    log "gpu-check: FAILED: nvidia-smi lists $smi_gpus GPU(s) but this build's CUDA runtime can use none"
    echo "$probe" | sed -n 1p
    echo "driver: ${smi_driver:-unknown} (nvidia-smi); ${versions:-runtime version unknown}"
    echo "The CUDA 13 runtime needs driver r580 or newer. On an older driver (535-570): install"
    echo "the CUDA forward-compatibility package (cuda-compat-13-0, datacenter GPUs only), or build"
    echo "with an older toolkit (WB_CUDA_ROOT=/usr/local/cuda-12.x ./wb gpu-check). docs/gpu.md,"
    echo "'Supported drivers'."
    exit 2
  fi
  for c in "${CHECKS[@]}"; do echo "check: ${c%%|*} - ${c#*|}"; done
  reason=${probe#gpus: 0 (}
  reason=${reason%%$'\n'*}
  echo "no GPU: ${reason%)}; nothing above was run (build only)."
  exit 0
fi
echo "$probe"
runtime_gpus=$(sed -n 's/^gpus: \([0-9]*\).*/\1/p' <<<"$probe")

ROWS=()
failed=0
# Each row is also logged as it comes: a run cut short still says how far it got.
row() { ROWS+=("$1|$2|$3"); log "$1: $2 $3"; [ "$2" = FAIL ] && failed=1; return 0; }
# Every check is bounded: a hang (a wedged device, an IPC open that never returns) is a FAIL.
CHECK_TIMEOUT=${WB_GPU_CHECK_TIMEOUT:-180}
# run_catch NAME CMD...: PASS, FAIL, or SKIPPED when a case reported "skipped:" on a GPU host.
run_catch() {
  local name=$1 out
  shift
  out=$(timeout "$CHECK_TIMEOUT" "$@" 2>&1)
  local rc=$?
  echo "$out" >"$LOGS/$name.log"
  if [ $rc -ne 0 ]; then echo FAIL; elif grep -q "skipped:" <<<"$out"; then echo SKIPPED; else echo PASS; fi
}
# figures JSON_LINES: the numbers worth a glance (gbps, hbm fraction / pct) as k=v.
figures() {
  python3 -c '
import json, sys
gpu, cpu = [], []
for line in sys.stdin:
    try: d = json.loads(line)
    except Exception: continue
    tag = d.get("path") or d.get("name") or ""
    out = cpu if d.get("device") == "cpu" else gpu  # the device lines first
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or k == "peak_gbps": continue
        if "gbps" in k or "hbm" in k or "pct" in k or k.endswith("_ms"):
            out.append(("%s:" % tag if tag else "") + "%s=%s" % (k, round(v, 3)))
print(" ".join((gpu + cpu)[:6]))'
}
LOGS=${WB_GPU_CHECK_LOGS:-$(mktemp -d)}  # WB_GPU_CHECK_LOGS: keep the logs there
mkdir -p "$LOGS"

row cuda-build PASS "$(echo "$probe" | sed -n 3p | cut -c1-60)"
if [ "$smi_gpus" -eq 0 ]; then
  row gpus-visible SKIPPED "no nvidia-smi; $versions"
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ] || [ "$smi_mig" -gt 0 ]; then
  row gpus-visible SKIPPED "CUDA_VISIBLE_DEVICES or MIG: runtime $runtime_gpus, nvidia-smi $smi_gpus"
elif [ "$runtime_gpus" -lt "$smi_gpus" ]; then
  row gpus-visible FAIL "runtime sees $runtime_gpus of $smi_gpus GPUs; driver $smi_driver; $versions"
else
  row gpus-visible PASS "$runtime_gpus GPUs; driver $smi_driver; $versions"
fi
row staging-host "$(run_catch staging bash -c "$BIN/tests/gpu/staging_pipeline_test && $BIN/tests/gpu/delta_gpu_host_test && $BIN/tests/executor/gpu_source_test")" ""
r=$(run_catch transform $BIN/tests/transform/transform_cuda_test)
row transform-kernels "$r" "$(timeout "$CHECK_TIMEOUT" $BIN/tests/bench/transform_bench 2>/dev/null | figures)"
# From the repository root, as a user would: the test finds ipc_open_helper in its runfiles.
row cuda-ipc "$(run_catch ipc $BIN/tests/transform/gpu_helpers_test)" ""
if [ "${runtime_gpus:-0}" -ge 2 ]; then
  # The child sees the GPUs in reverse order: ordinals differ, the UUID still finds the device.
  order=$(seq $((runtime_gpus - 1)) -1 0 | paste -sd,)
  row cuda-ipc-renumbered "$(run_catch ipc2 env WB_TEST_IPC_CHILD_VISIBLE_DEVICES="$order" \
    $BIN/tests/transform/gpu_helpers_test '[cuda]')" "child CUDA_VISIBLE_DEVICES=$order"
else
  row cuda-ipc-renumbered SKIPPED "one GPU"
fi
pydir=$(mktemp -d)
cp -r client/python/weightbeam "$pydir/" && cp -r $BIN/client/python/weightbeam/v1 "$pydir/weightbeam/"
pyout=$(PYTHONPATH="$pydir" PYTHONDONTWRITEBYTECODE=1 timeout "$CHECK_TIMEOUT" python3 tests/gpu/python_ipc_check.py \
  $BIN/tests/transform/ipc_open_helper 2>&1)
case $? in 0) r=PASS ;; 3) r=SKIPPED ;; *) r=FAIL ;; esac
echo "$pyout" >"$LOGS/python-ipc.log"
row python-cuda-ipc "$r" ""
dmabuf=$(timeout 60 $BIN/tests/gpu/dmabuf_probe)
case $? in 0) r=PASS ;; 2) r=REFUSED ;; *) r=FAIL ;; esac
row dma-buf "$r" "$dmabuf"
r=$(run_catch encode $BIN/tests/gpu/delta_gpu_encode_test)
row delta-encode "$r" "$(timeout "$CHECK_TIMEOUT" $BIN/tests/bench/delta_encode_gpu_bench 2>/dev/null | figures)"
r=$(run_catch scatter $BIN/tests/transform/delta_gpu_test)
row delta-scatter "$r" "$(timeout "$CHECK_TIMEOUT" $BIN/tests/bench/delta_scatter_bench 2>/dev/null | figures)"
row transport-tcp-gpu "$(run_catch tcp env WB_TEST_TRANSPORT=tcp $BIN/tests/transport/transport_suite '[gpu]')" ""
row transport-local-gpu "$(run_catch local env WB_TEST_TRANSPORT=local $BIN/tests/transport/transport_suite '[gpu]')" ""
# rdma with GPU memory needs an RDMA device (WB_TEST_RDMA_DEVICE picks one; else the first).
rdma_dev=${WB_TEST_RDMA_DEVICE:-$(ls /sys/class/infiniband 2>/dev/null | head -1)}
if [ -n "$rdma_dev" ]; then
  row transport-rdma-gpu "$(run_catch rdma env WB_TEST_TRANSPORT=rdma WB_TEST_RDMA_DEVICE="$rdma_dev" \
    $BIN/tests/transport/transport_suite '[gpu]')" "$rdma_dev"
else
  row transport-rdma-gpu SKIPPED "no RDMA device (/sys/class/infiniband is empty)"
fi
# demo_gpu NAME ARGS...: wb-demo --gpu; exit 3 is its "no usable GPU" (said on its first line).
demo_gpu() {
  local name=$1 out rc
  shift
  out=$(timeout "$CHECK_TIMEOUT" $BIN/tests/demo/wb-demo --bin-dir "$BIN" --gpu --layers 2 --steps 3 "$@" 2>&1)
  rc=$?
  echo "$out" >"$LOGS/$name.log"
  case $rc in 0) echo PASS ;; 3) echo "NO-GPU" ;; *) echo FAIL ;; esac
}
# The last step's GB/s (the table's fifth column: BYTES is "<n> <unit>").
last_gbps() { awk '/^[0-9]+ +[0-9.]+ [KMGT]?i?B /{g=$5} END{if (g != "") print "last step " g " GB/s"}' "$1"; }
# A cluster test: its daemons come from $BIN (Runfile: TEST_SRCDIR/TEST_WORKSPACE/<path>).
row capture-overwrite "$(run_catch capture-overwrite env TEST_SRCDIR="$(dirname "$BIN")" \
  TEST_WORKSPACE="$(basename "$BIN")" $BIN/tests/gpu/capture_overwrite_test)" ""
dense=$(demo_gpu demo-gpu)
delta=$(demo_gpu demo-gpu-delta --delta)
r=FAIL
if [ "$dense" = PASS ] && [ "$delta" = PASS ]; then r=PASS; elif [ "$dense" = NO-GPU ]; then r=SKIPPED; fi
row demo-gpu "$r" "dense $dense ($(last_gbps "$LOGS/demo-gpu.log")), delta $delta"
nowait=$(demo_gpu demo-gpu-nowait --capture --staged)
r=FAIL
case $nowait in PASS) r=PASS ;; NO-GPU) r=SKIPPED ;; esac
# The last step's trainer hold and inference pause (TRAINER HELD and INFER. PAUSED columns).
held=$(awk '/^[0-9]+ +[0-9.]+ [KMGT]?i?B /{h=$6 " " $7; p=$8 " " $9} END{if (h != "") print "held " h ", paused " p}' \
  "$LOGS/demo-gpu-nowait.log")
row demo-gpu-nowait "$r" "$nowait ($(last_gbps "$LOGS/demo-gpu-nowait.log")${held:+, $held})"

printf '\n%-20s %-8s %s\n' check result figure
for r in "${ROWS[@]}"; do
  IFS='|' read -r name result fig <<<"$r"
  printf '%-20s %-8s %s\n' "$name" "$result" "$fig"
done
echo "logs: $LOGS"
exit $failed
