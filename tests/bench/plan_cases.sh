#!/usr/bin/env bash
# Runs plan_bench on the planner's published cases, one process per case (peak RSS is per
# process), and prints one JSON line per case. Usage: tests/bench/plan_cases.sh [all|kimi|largest]
#   all      the three Kimi-K2 layouts, Qwen3-235B 128 -> 32, DeepSeek-V3 (config.json, vLLM)
#   largest  Kimi-K2-shaped models of growing depth under the TP16/EP16 layout until the
#            planner's peak RSS passes 4 GiB; prints the largest that stayed under
# Build first: bazel build -c opt //tests/bench:plan_bench
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCH=${PLAN_BENCH:-bazel-bin/tests/bench/plan_bench}
what=${1:-all}
kimi="--model=kimi-k2 --trainers=256 --inference-gpus=128"
run() { "$BENCH" "$@"; }
if [[ $what == all || $what == kimi ]]; then
  run $kimi --tp=16 --ep=16 --trainer-ep=64
  run $kimi --tp=16 --ep=16 --trainer-ep=1
  run $kimi  # TP 8, no EP (the bench's default)
fi
if [[ $what == all ]]; then
  run --model=qwen3-235b --trainers=128 --inference-gpus=32 --tp=8 --ep=8
  run --model=tests/bench/deepseek_v3_671b.json --engine=vllm --trainers=256 \
    --inference-gpus=128 --tp=16
fi
if [[ $what == largest ]]; then
  # Params grow linearly with depth (61 layers = 1.03 T); the step between tries is 61 layers.
  limit=$((4 * 1024 * 1024 * 1024))
  best=""
  for layers in $(seq 61 61 2440); do
    line=$(run $kimi --tp=16 --ep=16 --trainer-ep=64 --layers=$layers)
    echo "$line"
    rss=$(echo "$line" | sed -E 's/.*"peak_rss_bytes":([0-9]+).*/\1/')
    if ((rss > limit)); then break; fi
    best=$(echo "$line" | sed -E 's/.*"params":([0-9]+).*/\1/')
  done
  echo "{\"largest_params_within_4GiB\":${best:-0}}"
fi
