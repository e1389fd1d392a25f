#!/usr/bin/env bash
# Runs plan_bench on the planner's published cases, one process per case (peak RSS is per
# process), and prints one JSON line per case. Usage: tests/bench/plan_cases.sh [all|kimi|largest]
#   all      the three Kimi-K2 layouts, Qwen3-235B 128 -> 32, DeepSeek-V3 (config.json, vLLM)
#   trainers Megatron-core trainer layouts: DeepSeek-V3 PP16 x EP16, Qwen3-235B TP4 x PP4 x
#            EP8 x DP2, Llama-3.1-405B TP8 x PP8 x DP2, into vLLM FP8 and BF16 (94 and 126
#            layers do not split evenly over 4 and 8 stages: the stages' layer counts are given)
#   relays   issue 30's fleets with relays allowed: Kimi-K2 256 -> 512 (32 replicas of TP16
#            EP16, FP8), Qwen3-235B 32 -> 256 (32 replicas of TP8 EP8), Kimi-K2 256 -> 128
#            (receiver-bound: must not change); each prints the step without and with relays
#            against the receivers' limit
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
if [[ $what == trainers ]]; then
  uptime
  # NeMo-RL's DeepSeek-V3 layout: PP16 x EP16 (tp 1, dp 16 = 256 GPUs; 61 layers as 3, 14 x 4,
  # 2), into vLLM TP16 x DP16 (EP 256) FP8, the closest to its TP32 x DP8 that weightbeam
  # accepts (TP32 FP8 cuts 128x128 blocks of the dense and shared-expert MLPs). Each case also
  # into BF16 / FP8. Where layers do not split evenly, the first and last stages (which also hold
  # the embedding and the output layer) get one layer fewer: the stages then hold about the
  # same bytes, which bounds the sender imbalance (stage_bound_imbalance).
  deepseek="--model=tests/bench/deepseek_v3_671b.json --engine=vllm --trainer=megatron
    --trainer-tp=1 --trainer-pp=16 --trainer-ep=16 --trainer-dp=16
    --trainer-stage-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 --inference-gpus=256 --tp=16 --ep=256"
  qwen="--model=tests/bench/qwen3_235b_a22b.json --engine=vllm --trainer=megatron --trainer-tp=4
    --trainer-pp=4 --trainer-ep=8 --trainer-dp=2 --trainer-stage-layers=23,24,24,23
    --inference-gpus=32 --tp=8 --ep=8"
  llama="--model=tests/bench/llama_3_1_405b.json --engine=vllm --trainer=megatron --trainer-tp=8
    --trainer-pp=8 --trainer-dp=2 --trainer-stage-layers=15,16,16,16,16,16,16,15
    --inference-gpus=16 --tp=8"
  run $deepseek
  run $deepseek --bf16
  run $qwen --bf16
  run $qwen
  run $llama --bf16
  run $llama
  uptime
fi
if [[ $what == relays ]]; then
  uptime
  run --model=kimi-k2 --trainers=256 --inference-gpus=512 --tp=16 --ep=16 --relays
  run --model=qwen3-235b --trainers=32 --inference-gpus=256 --tp=8 --ep=8 --relays
  run $kimi --tp=16 --ep=16 --relays
  uptime
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
