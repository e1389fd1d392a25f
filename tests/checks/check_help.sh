#!/usr/bin/env bash
# Every --help prints at once, as any user, with nothing set up: `./wb VERB --help` and
# `tests/cluster/cluster.sh --help` run from a bare copy of the two scripts (no build, no
# packages needed), as an unprivileged user when this runs as root, each within 5 s, exit 0,
# "usage:" on stdout, and no network namespace made. Run by ./wb test (tests/run_extra.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
bare=$(mktemp -d /tmp/wb-help.XXXXXX)
trap 'rm -rf "$bare"' EXIT
mkdir -p "$bare/tests/cluster"
cp wb "$bare/wb"
cp tests/cluster/cluster.sh "$bare/tests/cluster/cluster.sh"
chmod -R a+rX "$bare"

as_user=()
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  as_user=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
fi
netns_before=$(ip netns list 2>/dev/null | wc -l)
failed=0
check() {
  local out rc start=$SECONDS
  out=$(cd "$bare" && timeout 5 env -i PATH=/usr/bin:/bin HOME=/nonexistent "${as_user[@]}" "$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "usage:" <<<"$out"; then
    echo "help: '$*' exited $rc after $((SECONDS - start)) s without a usage line:" >&2
    printf '%s\n' "$out" | head -5 >&2
    failed=1
  fi
}
for verb in "" demo up down package test build deps cluster gpu-check fmt vm; do
  check ./wb $verb --help
done
check ./wb cluster --agents 8 -h
check tests/cluster/cluster.sh --help
netns_after=$(ip netns list 2>/dev/null | wc -l)
if [ "$netns_after" -ne "$netns_before" ]; then
  echo "help: a --help made network namespaces ($netns_before -> $netns_after)" >&2
  failed=1
fi
who=$(id -un)
[ ${#as_user[@]} -gt 0 ] && who=nobody
[ $failed -eq 0 ] && echo "help: every --help printed its usage at once, as $who, from a bare copy"
exit $failed
