#!/usr/bin/env bash
# The short cluster run of ./wb test (tests/run_extra.sh): 4 agents, the small model, 2 balanced
# steps and the kill-and-restart scenario, every byte verified; checks that nothing is left
# behind. About a minute.
set -uo pipefail
cd "$(dirname "$0")/../.."
bazel build --jobs=2 //daemon:wb-agent //controller:wb-controller //tests/cluster:wb-cluster \
  >/dev/null 2>&1 || { echo "[cluster] build failed" >&2; exit 1; }
out=$(mktemp)
tests/cluster/cluster.sh --agents 4 --model k2-tiny --link-seconds 2 --steps 2 \
  --scenario balanced,kill 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
# Steps verified, and the teardown left no namespace (nor, with them, links or processes).
prefix=$(grep -o 'namespaces (wbc[0-9]*' "$out" | head -1 | sed 's/.*(//')
if [ "$rc" -eq 0 ] && grep -q '"verified":true' "$out" && grep -q 'torn down: no namespace' "$out" &&
  [ -n "$prefix" ] && ! ip netns list | grep -q "^$prefix-"; then
  rm -f "$out"
  exit 0
fi
echo "[cluster] short run failed (output in $out)" >&2
exit 1
