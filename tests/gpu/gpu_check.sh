#!/usr/bin/env bash
# ./wb gpu-check: builds with CUDA, then runs every GPU test and benchmark and prints one table
# (check, result, figure). Without a GPU it builds, lists the checks (one `check:` line each),
# says why there is no GPU and exits 0. On a GPU machine run it first; paste its table into the
# closing note (docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
log() { printf '\033[1m[wb]\033[0m %s\n' "$*" >&2; }
BAZEL_FLAGS=(--jobs=2)

# name | what it proves
CHECKS=(
  "cuda-build|every .cu file compiled with nvcc (no stand-ins); devices listed"
  "staging-host|staging pipeline, kernel geometry and executor GPU-source host tests (no GPU needed)"
  "transform-kernels|CUDA transforms bit-exact with the CPU (golden + random); GB/s, % of HBM"
  "cuda-ipc|CUDA IPC: a handle exported here opened in another process"
  "dma-buf|the driver exports device memory as dma-buf (rdma GPUDirect path)"
  "delta-encode|GPU delta encode bit-identical to the CPU codec; GB/s, % of HBM, both shadows"
  "delta-scatter|GPU delta scatter equal to the host apply; GB/s"
  "transport-tcp-gpu|transport suite, tcp, GPU source/destination regions (pinned staging)"
  "transport-local-gpu|transport suite, local, GPU regions (CUDA driver copies)"
  "demo-gpu|end-to-end demo with GPU buffers on both sides (wb-demo --gpu, dense and --delta)"
)

TEST_TARGETS=(
  //tests/gpu:cuda_build_check //tests/gpu:staging_pipeline_test //tests/gpu:delta_gpu_host_test
  //tests/gpu:delta_gpu_encode_test //tests/transform:transform_cuda_test
  //tests/transform:gpu_helpers_test //tests/transform:delta_gpu_test
  //tests/executor:gpu_source_test
)
BIN_TARGETS=(
  //tests/gpu:gpu_probe //tests/gpu:dmabuf_probe //tests/bench:transform_bench
  //tests/bench:delta_scatter_bench //tests/bench:delta_encode_gpu_bench
  //tests/transport:transport_suite //tests/demo:wb-demo //daemon:wb-agent //controller:wb-controller
)

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

probe=$(bazel-bin/tests/gpu/gpu_probe)
probe_rc=$?
if [ "$probe_rc" -ne 0 ]; then
  for c in "${CHECKS[@]}"; do echo "check: ${c%%|*} - ${c#*|}"; done
  reason=${probe#gpus: 0 (}
  echo "no GPU: ${reason%)}; nothing above was run (build only)."
  exit 0
fi
echo "$probe"

ROWS=()
failed=0
row() { ROWS+=("$1|$2|$3"); [ "$2" = FAIL ] && failed=1; return 0; }
# run_catch NAME CMD...: PASS, FAIL, or SKIPPED when a case reported "skipped:" on a GPU host.
run_catch() {
  local name=$1 out
  shift
  out=$("$@" 2>&1)
  local rc=$?
  echo "$out" >"$LOGS/$name.log"
  if [ $rc -ne 0 ]; then echo FAIL; elif grep -q "skipped:" <<<"$out"; then echo SKIPPED; else echo PASS; fi
}
# figures JSON_LINES: the numbers worth a glance (gbps, hbm fraction / pct) as k=v.
figures() {
  python3 -c '
import json, sys
out = []
for line in sys.stdin:
    try: d = json.loads(line)
    except Exception: continue
    tag = d.get("path") or d.get("name") or ""
    for k, v in d.items():
        if isinstance(v, (int, float)) and ("gbps" in k or "hbm" in k or "pct" in k) and k != "peak_gbps":
            out.append(("%s:" % tag if tag else "") + "%s=%s" % (k, round(v, 3)))
print(" ".join(out[:6]))'
}
LOGS=$(mktemp -d)

row cuda-build PASS "$(echo "$probe" | sed -n 2p | cut -c1-60)"
row staging-host "$(run_catch staging bash -c 'bazel-bin/tests/gpu/staging_pipeline_test && bazel-bin/tests/gpu/delta_gpu_host_test && bazel-bin/tests/executor/gpu_source_test')" ""
r=$(run_catch transform bazel-bin/tests/transform/transform_cuda_test)
row transform-kernels "$r" "$(bazel-bin/tests/bench/transform_bench 2>/dev/null | figures)"
row cuda-ipc "$(run_catch ipc bazel-bin/tests/transform/gpu_helpers_test)" ""
dmabuf=$(bazel-bin/tests/gpu/dmabuf_probe)
case $? in 0) r=PASS ;; 2) r=REFUSED ;; *) r=FAIL ;; esac
row dma-buf "$r" "$dmabuf"
r=$(run_catch encode bazel-bin/tests/gpu/delta_gpu_encode_test)
row delta-encode "$r" "$(bazel-bin/tests/bench/delta_encode_gpu_bench 2>/dev/null | figures)"
r=$(run_catch scatter bazel-bin/tests/transform/delta_gpu_test)
row delta-scatter "$r" "$(bazel-bin/tests/bench/delta_scatter_bench 2>/dev/null | figures)"
row transport-tcp-gpu "$(run_catch tcp env WB_TEST_TRANSPORT=tcp bazel-bin/tests/transport/transport_suite '[gpu]')" ""
row transport-local-gpu "$(run_catch local env WB_TEST_TRANSPORT=local bazel-bin/tests/transport/transport_suite '[gpu]')" ""
# demo_gpu NAME ARGS...: wb-demo --gpu; exit 3 is its "no usable GPU" (said on its first line).
demo_gpu() {
  local name=$1 out rc
  shift
  out=$(bazel-bin/tests/demo/wb-demo --bin-dir bazel-bin --gpu --layers 2 --steps 3 "$@" 2>&1)
  rc=$?
  echo "$out" >"$LOGS/$name.log"
  case $rc in 0) echo PASS ;; 3) echo "NO-GPU" ;; *) echo FAIL ;; esac
}
# The last step's GB/s (the table's fifth column: BYTES is "<n> <unit>").
last_gbps() { awk '/^[0-9]+ +[0-9.]+ [KMGT]?i?B /{g=$5} END{if (g != "") print "last step " g " GB/s"}' "$1"; }
dense=$(demo_gpu demo-gpu)
delta=$(demo_gpu demo-gpu-delta --delta)
r=FAIL
if [ "$dense" = PASS ] && [ "$delta" = PASS ]; then r=PASS; elif [ "$dense" = NO-GPU ]; then r=SKIPPED; fi
row demo-gpu "$r" "dense $dense ($(last_gbps "$LOGS/demo-gpu.log")), delta $delta"

printf '\n%-20s %-8s %s\n' check result figure
for r in "${ROWS[@]}"; do
  IFS='|' read -r name result fig <<<"$r"
  printf '%-20s %-8s %s\n' "$name" "$result" "$fig"
done
echo "logs: $LOGS"
exit $failed
