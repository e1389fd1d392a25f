#!/usr/bin/env bash
# ./wb demo: runs wb-demo (built by ./wb) from the repository root.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The steps' timeline goes to .cache/demo-trace.json unless --trace says otherwise.
trace=()
case " $* " in
  *" --trace "* | *" --trace="*) ;;
  *) mkdir -p .cache 2>/dev/null && trace=(--trace "$PWD/.cache/demo-trace.json") ;;
esac
exec bazel-bin/tests/demo/wb-demo --bin-dir bazel-bin "${trace[@]}" "$@"
