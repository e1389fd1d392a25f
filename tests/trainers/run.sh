#!/usr/bin/env bash
# Real torch 2.x DTensor trainers (docs/trainers.md "Registering a real DTensor model"): FSDP2,
# HSDP and FSDP2 + TP models built by `transformers`, registered straight from the model through
# real daemons into vLLM layouts of another size, BF16 and FP8, two versions, every byte checked.
# Run by tests/run_extra.sh (./wb test); alone: tests/trainers/run.sh [--cases fsdp2,...].
# Uses .cache/venv-engines (torch, transformers) as tests/vllm/run.sh installs it, without
# changing it: weightbeam is staged from this checkout (deploy/stage_python.sh) onto PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV="$ROOT/.cache/venv-engines"
LOGS="$ROOT/.cache/logs"
mkdir -p "$LOGS"
log() { printf '[wb] %s\n' "$*" >&2; }

if [ "$(cat "$VENV/.lock-sha256" 2>/dev/null)" != "$(sha256sum tests/vllm/requirements.lock | cut -d' ' -f1)" ]; then
  log "trainers: .cache/venv-engines is missing or stale; tests/vllm/run.sh installs it"
  exit 1
fi

log "trainers: building wb-agent, wb-controller and the Python stubs"
bazel build --jobs=2 //daemon:wb-agent //controller:wb-controller //client/python:stubs \
  >"$LOGS/trainers-build.log" 2>&1 || { tail -n 20 "$LOGS/trainers-build.log" >&2; exit 1; }

stage=$(mktemp -d /tmp/wb-trainers-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT
deploy/stage_python.sh "$stage"
export PYTHONPATH="$stage" WB_BIN_DIR="$ROOT/bazel-bin"
"$VENV/bin/python" tests/trainers/suite.py "$@"
