#!/bin/bash
# Runs one Python test module (or, given a .py file, that script) with Debian's /usr/bin/python3
# (grpcio, protobuf, numpy) under `bazel test` / `bazel run`: the weightbeam package and its generated stubs come from the runfiles, and the
# wb-agent / wb-controller binaries from $WB_BIN_DIR (the runfiles root; $WB_SRC_DIR for sources).
set -euo pipefail
root="${TEST_SRCDIR:-$PWD/..}/weightbeam"
export WB_BIN_DIR="$root" WB_SRC_DIR="$root"
export PYTHONPATH="$root/client/python:$root/tests/python"
export PYTHONDONTWRITEBYTECODE=1
if [[ "${1:-}" == *.py ]]; then
  exec /usr/bin/python3 "$root/tests/python/$1" "${@:2}"
fi
exec /usr/bin/python3 -m unittest -v "$@"
