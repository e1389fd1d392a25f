#!/usr/bin/env bash
# ./wb demo: runs wb-demo (built by ./wb) from the repository root.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bazel-bin/tests/demo/wb-demo --bin-dir bazel-bin "$@"
