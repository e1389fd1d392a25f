#!/usr/bin/env bash
# The inference side of the weightbeam vLLM backend: an ordinary vLLM server whose workers
# receive weights through weightbeam (docs/engines.md "vLLM backend"). Needs the weightbeam
# wheel installed next to vLLM (its vllm.general_plugins entry point registers the backend) and
# a wb-agent on this node with `receive.mode: staged` (the engine pauses only for the local
# swap). The trainer (vllm_train_loop.py) sends the workers their init info: the agent socket,
# the replica number, where to write the conformance table.
#
#   client/python/examples/vllm_serve.sh MODEL_DIR [more vllm serve flags, e.g. -tp 2]
set -euo pipefail
model=${1:?usage: vllm_serve.sh MODEL_DIR [vllm serve flags]}
shift
# The weight-sync HTTP routes (/init_weight_transfer_engine, /update_weights, ...) are served in
# vLLM's development mode only.
export VLLM_SERVER_DEV_MODE=1
# Prefix caching would serve prompts from KV blocks computed with the previous weights.
exec python3 -m vllm.entrypoints.openai.api_server --model "$model" \
  --weight-transfer-config '{"backend": "weightbeam"}' --no-enable-prefix-caching "$@"
