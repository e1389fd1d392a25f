#!/usr/bin/env bash
# The layer rules of docs/concepts.md, checked on the build graph: daemon/ and controller/ never
# depend on each other, client/ on neither. Bazel visibility already refuses most such edges;
# this catches a visibility list widened by mistake. Run by ./wb test (tests/run_extra.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."

# "FROM TO": nothing under //FROM/... may depend on anything under //TO/...
RULES=(
  "controller daemon"
  "daemon controller"
  "client daemon"
  "client controller"
  "common daemon"
  "common controller"
  "common client"
)

failed=0
for rule in "${RULES[@]}"; do
  read -r from to <<<"$rule"
  if ! edges=$(bazel query --noshow_progress --output=label \
      "deps(//$from/...) intersect //$to/..." 2>/tmp/wb-layers.$$); then
    echo "layers: bazel query failed for $from -> $to:" >&2
    cat /tmp/wb-layers.$$ >&2
    failed=1
    continue
  fi
  if [ -n "$edges" ]; then
    echo "layers: //$from/... depends on //$to/... (not allowed):" >&2
    printf '  %s\n' $edges >&2
    for e in $edges; do
      bazel query --noshow_progress "somepath(//$from/..., $e)" 2>/dev/null | sed 's/^/    via /' >&2
      break
    done
    failed=1
  fi
done
rm -f /tmp/wb-layers.$$

# Visibility must not open daemon/ or controller/ to each other or to everyone.
while IFS= read -r f; do
  layer=${f%%/*}
  other=daemon
  [ "$layer" = daemon ] && other=controller
  if grep -nE "\"//($other|client):__subpackages__\"|\"//:__subpackages__\"|//visibility:public" "$f"; then
    echo "layers: $f opens its targets beyond $layer/ and tests/ (lines above)" >&2
    failed=1
  fi
done < <(git ls-files 'daemon/**BUILD.bazel' 'controller/**BUILD.bazel' 'daemon/BUILD.bazel' 'controller/BUILD.bazel')

if [ "$failed" -eq 0 ]; then echo "layers: no edge between daemon/, controller/ and client/ (${#RULES[@]} rules)"; fi
exit "$failed"
