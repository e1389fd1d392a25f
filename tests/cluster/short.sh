#!/usr/bin/env bash
# The short cluster run of ./wb test (tests/run_extra.sh): 8 agents (two inference replicas, so
# the kill scenario is elastic: the step commits to the other replica), two data-parallel copies
# of the trainer weights, the small model, every scenario (balanced, delta, slow-link: three
# slow steps, the re-plan moving work off the slow link, a recovery step; kill and catch-up), then
# the relay scenario (2 -> 6 agents, relays chosen by the cost model), then balanced steps with
# capture and staged receive, then controller failover (4 agents), every byte verified; bounded in time (a scenario that blocks is killed, and the run fails) and checks
# that nothing is left behind. A few minutes on a loaded 2-core machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
bazel build --jobs=2 //daemon:wb-agent //controller:wb-controller //tests/cluster:wb-cluster \
  >/dev/null 2>&1 || { echo "[cluster] build failed" >&2; exit 1; }
out=$(mktemp)
# cluster.sh tears everything down on SIGTERM (its trap); SIGKILL 30 s later if it does not.
timeout --kill-after=30 "${WB_CLUSTER_SHORT_TIMEOUT:-900}" tests/cluster/cluster.sh --agents 8 \
  --model k2-tiny --link-seconds 1 --steps 2 --trainer-replicas 2 --scenario all 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
# Relays: 2 trainer nodes -> 6 inference nodes (three replicas), planned without and with relays,
# every byte verified; the plan with relays must have chosen a tree.
if [ "$rc" -eq 0 ]; then
  timeout --kill-after=30 "${WB_CLUSTER_SHORT_TIMEOUT:-900}" tests/cluster/cluster.sh --agents 8 \
    --model k2-tiny --link-seconds 1 --steps 2 --scenario relay 2>&1 | tee -a "$out"
  rc=${PIPESTATUS[0]}
  grep -q '^relays: 1 replica(s) per family\|^relays: [0-9]* replica(s) per family' "$out" || rc=1
fi
# Nobody waits: trainer agents capture, inference agents stage; the ranks move to the next
# version as soon as a step is captured, the workers still verify every byte of each version.
if [ "$rc" -eq 0 ]; then
  timeout --kill-after=30 "${WB_CLUSTER_SHORT_TIMEOUT:-900}" tests/cluster/cluster.sh --agents 8 \
    --model k2-tiny --link-seconds 1 --steps 2 --scenario balanced --capture --staged 2>&1 |
    tee -a "$out"
  rc=${PIPESTATUS[0]}
  grep -q '"capture":"captured' "$out" || rc=1
  grep -q '"staged_replicas":[1-9]' "$out" || rc=1
fi
# Controller failover (issue 45): two controllers and etcd; the leader's namespace is cut
# mid-step, the step commits on the standby, the old leader joined back stands by.
if [ "$rc" -eq 0 ]; then
  timeout --kill-after=30 "${WB_CLUSTER_SHORT_TIMEOUT:-900}" tests/cluster/cluster.sh --agents 4 \
    --model k2-tiny --link-seconds 1 --steps 1 --scenario failover 2>&1 | tee -a "$out"
  rc=${PIPESTATUS[0]}
  grep -q '"scenario":"failover","summary":true.*"committed":true,"old_leader_stands_by":true.*"back_committed":true' \
    "$out" || rc=1
fi
[ "$rc" -eq 124 ] && echo "[cluster] the short run did not finish within ${WB_CLUSTER_SHORT_TIMEOUT:-900} s" >&2
# Steps verified, the kill scenario's elastic checks, and the teardown left no namespace (nor,
# with them, links or processes).
prefix=$(grep -o 'namespaces (wbc[0-9]*' "$out" | head -1 | sed 's/.*(//')
if [ "$rc" -eq 0 ] && grep -q '"verified":true' "$out" && grep -q 'torn down: no namespace' "$out" &&
  grep -q 'its replica is listed as skipped' "$out" && grep -q 'caught up' "$out" &&
  grep -q 'on the new plan trainer-0 sent' "$out" &&
  [ -n "$prefix" ] && ! ip netns list | grep -q "^$prefix-"; then
  rm -f "$out"
  exit 0
fi
echo "[cluster] short run failed (output in $out)" >&2
exit 1
