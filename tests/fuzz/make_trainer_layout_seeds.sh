#!/usr/bin/env bash
# Writes tests/fuzz/corpus/trainer_layout: TrainerLayoutRequests (protoc --encode) with
# Megatron and DTensor settings around their limits, the issue 41 item 7 crash among them.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=tests/fuzz/corpus/trainer_layout
mkdir -p "$out"
config=$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' \
  tests/python/engine_configs/qwen3_moe.json)
# Four query groups: tp 4 divides them, so the vocab padding is reached.
config4=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["num_key_value_heads"]=4; print(json.dumps(json.dumps(c)))' \
  tests/python/engine_configs/qwen3_moe.json)
seed() {
  printf 'config_json: %s\n%s\n' "${3:-$config}" "$2" |
    protoc -Iproto --encode=weightbeam.v1.TrainerLayoutRequest proto/weightbeam/v1/local.proto \
      >"$out/$1"
}
seed megatron-tp2 'megatron { tp: 2 tp_rank: 1 }'
seed megatron-vocab-wrap 'megatron { tp: 4 vocab_divisible_by: 4611686018427387904 }' "$config4"
seed megatron-vocab-negative 'megatron { vocab_divisible_by: -1 }'
seed megatron-tp-max 'megatron { tp: 2147483647 }'
seed megatron-pp-stages 'megatron { pp: 2 pp_rank: 1 stage_layers_given: true stage_layers: 1 }'
seed megatron-moe 'megatron { tp: 2 ep: 2 ep_rank: 1 etp: 2 etp_rank: 1 sequential_experts: true }'
seed dtensor-fsdp 'dtensor { mesh: 2 coords: 1 rules { pattern: "*" placements: "S(0)" } }'
seed dtensor-ep 'dtensor { mesh: 2 mesh: 2 coords: 0 coords: 1 fused_experts: true rules { pattern: "*.experts.*" placements: "S(0),S(1)" } rules { pattern: "*" placements: "R,S(0)" } }'
seed dtensor-mesh-max 'dtensor { mesh: 2147483647 coords: 0 }'
