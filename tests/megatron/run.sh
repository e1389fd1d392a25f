#!/usr/bin/env bash
# The Megatron-core suite (docs/trainers.md "Megatron-core from the model"): real megatron-core
# GPTModels on CPU (gloo, one process per rank) registered straight from the model, stepped
# into vLLM-layout ranks through real daemons, every byte checked against Megatron's own dist
# checkpoint. Run by tests/run_extra.sh (./wb test); alone: tests/megatron/run.sh
# [--cases dense-tp2-tied,...] [--keep].
# Installs, first: the pinned packages of tests/megatron/requirements.lock into
# .cache/venv-megatron (once per lock file), a small venv whose site-packages reach
# .cache/venv-engines' (torch and the rest; tests/vllm/run.sh installs that one) through a .pth
# file. weightbeam itself comes from this checkout (staged, on PYTHONPATH).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
ENGINES="$ROOT/.cache/venv-engines"
VENV="$ROOT/.cache/venv-megatron"
LOCK=tests/megatron/requirements.lock
LOGS="$ROOT/.cache/logs"
mkdir -p "$LOGS"
log() { printf '[wb] %s\n' "$*" >&2; }

if [ ! -f "$ENGINES/.lock-sha256" ] || [ ! -x "$ENGINES/bin/python" ]; then
  log "megatron: .cache/venv-engines (torch) is missing: tests/vllm/run.sh installs it first"
  exit 1
fi
engines_site=$("$ENGINES/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
want=$(sha256sum "$LOCK" | cut -d' ' -f1)
if [ "$(cat "$VENV/.lock-sha256" 2>/dev/null)" != "$want" ]; then
  log "megatron: installing the pinned megatron-core (a few MB) into .cache/venv-megatron"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$engines_site" >"$site/wb-venv-engines.pth"
  if ! "$VENV/bin/pip" install -q --no-deps --disable-pip-version-check -r "$LOCK" \
      >"$LOGS/venv-megatron.log" 2>&1; then
    tail -n 20 "$LOGS/venv-megatron.log" >&2
    log "megatron: installing megatron-core FAILED (.cache/logs/venv-megatron.log)"
    exit 1
  fi
  echo "$want" >"$VENV/.lock-sha256"
fi

log "megatron: building wb-agent, wb-controller and the Python stubs"
bazel build --jobs=2 //daemon:wb-agent //controller:wb-controller //client/python:stubs \
  >"$LOGS/megatron-build.log" 2>&1 || { tail -n 20 "$LOGS/megatron-build.log" >&2; exit 1; }

# weightbeam from this checkout, as its wheel holds it (staged as deploy/package.sh stages it),
# ahead of any weightbeam installed in venv-engines.
stage=$(mktemp -d /tmp/wb-megatron-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT
deploy/stage_python.sh "$stage"
export PYTHONPATH="$stage" WB_BIN_DIR="$ROOT/bazel-bin"
"$VENV/bin/python" -W ignore -c 'import torch, megatron.core; print(f"[wb] megatron: megatron-core {megatron.core.__version__}, torch {torch.__version__}")' 2>/dev/null
rc=0
"$VENV/bin/python" -W ignore tests/megatron/suite.py "$@" || rc=$?
exit $rc
