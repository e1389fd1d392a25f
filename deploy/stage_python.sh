#!/usr/bin/env bash
# Stages the Python client as its wheel holds it (sources, the vLLM backend, the generated stubs
# from bazel-bin, pyproject.toml and VERSION) into DIR. Used by deploy/package.sh (the wheel and
# sdist) and tests/vllm/run.sh (weightbeam installed into the engine venv).
#   deploy/stage_python.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:?usage: deploy/stage_python.sh DIR}
install -d "$py/weightbeam/v1" "$py/weightbeam/vllm_backend"
install -m 0644 client/python/pyproject.toml VERSION "$py/"
install -m 0644 client/python/weightbeam/*.py "$py/weightbeam/"
install -m 0644 client/python/weightbeam/vllm_backend/*.py "$py/weightbeam/vllm_backend/"
install -m 0644 bazel-bin/client/python/weightbeam/v1/*.py "$py/weightbeam/v1/"
