#!/usr/bin/env bash
# The cluster in miniature (./wb cluster): makes one network namespace per agent plus one for
# the controller, joined by veth pairs to a bridge that lives in a namespace of its own (the
# "switch"), so nothing is added to the machine's own network; runs wb-cluster inside the
# controller's namespace (it shapes the links with tc and runs the scenarios); and tears
# everything down on exit, failure or Ctrl-C: processes in the namespaces, the namespaces (and
# with them every veth, the bridge and the qdiscs), and shared memory left by killed processes.
#
#   tests/cluster/cluster.sh [--agents N] [--link-mbit R] [--model k2-mini|k2-tiny]
#                            [--scenario balanced|slow-link|kill|delta|relay|failover|all]
#                            [--steps S] ...
# Needs root, iproute2 (ip netns, veth, bridge) and tc with tbf. Built binaries in bazel-bin.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
log() { printf '[cluster] %s\n' "$*" >&2; }

# --help before anything that needs root or makes a namespace.
for arg in "$@"; do
  case "$arg" in
    -h|--help) exec "$ROOT/wb" cluster --help ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  log "needs root (network namespaces, veth, tc)"
  exit 2
fi
BIN=$(readlink -f "${WB_BIN_DIR:-$ROOT/bazel-bin}")
[ -x "$BIN/tests/cluster/wb-cluster" ] || { log "build first: bazel build //tests/cluster:wb-cluster"; exit 2; }

AGENTS=8
SCENARIO=
MTU=${WB_CLUSTER_MTU:-9000}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --agents) AGENTS=${args[$((i + 1))]:-8} ;;
    --agents=*) AGENTS=${args[$i]#--agents=} ;;
    --scenario) SCENARIO=${args[$((i + 1))]:-} ;;
    --scenario=*) SCENARIO=${args[$i]#--scenario=} ;;
  esac
done
if ! [[ "$AGENTS" =~ ^[0-9]+$ ]] || [ "$AGENTS" -lt 4 ] || [ $((AGENTS % 4)) -ne 0 ] || [ "$AGENTS" -gt 128 ]; then
  log "--agents must be a multiple of 4 from 4 to 128"
  exit 2
fi
# Half trainer nodes, half inference nodes; the relay scenario trains on a quarter (wb-cluster
# makes the same split).
TRAINER_NODES=$((AGENTS / 2))
[ "$SCENARIO" = relay ] && TRAINER_NODES=$((AGENTS / 4))
PREFIX="wbc$$"
SUBNET=10.213.0

# Namespaces of this run, and of earlier runs whose script is gone (killed with SIGKILL).
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-" || true; }

teardown_prefix() {
  local prefix=$1 ns pids=() p
  local nss
  nss=$(our_namespaces "$prefix")
  [ -z "$nss" ] && return 0
  for ns in $nss; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$p"); done
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null
    for _ in $(seq 1 30); do
      local alive=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ $alive -eq 0 ] && break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null
    # Shared memory of processes that could not unlink their own (SharedBuffer names).
    for p in "${pids[@]}"; do rm -f /dev/shm/wb-"$p"-cluster-* 2>/dev/null; done
  fi
  for ns in $nss; do ip netns del "$ns" 2>/dev/null; done
}

# Every directory this run's processes make (sockets, configs, logs), removed with the namespaces:
# the processes are killed there, before their own clean-up could run.
export WB_TEMP_ROOT
WB_TEMP_ROOT=$(mktemp -d /tmp/wbc.XXXXXX)

TORN=0
teardown() {
  [ $TORN -eq 1 ] && return
  TORN=1
  teardown_prefix "$PREFIX"
  rm -rf "$WB_TEMP_ROOT"
  local left
  left=$(our_namespaces "$PREFIX")
  if [ -n "$left" ]; then log "could not remove: $left"; else log "torn down: no namespace, link or process of $PREFIX left"; fi
}
trap teardown EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

# Leftovers of runs that died without their trap (kill -9): their script's pid is gone.
for stale in $(ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^\(wbc[0-9]*\)-.*/\1/p' | sort -u); do
  if ! kill -0 "${stale#wbc}" 2>/dev/null; then
    log "removing leftovers of an earlier run ($stale)"
    teardown_prefix "$stale"
  fi
done

sh_or_fail() {
  if ! out=$("$@" 2>&1); then
    log "failed: $* ($out)"
    exit 1
  fi
}

# The switch: a bridge in its own namespace.
SW="$PREFIX-sw"
sh_or_fail ip netns add "$SW"
sh_or_fail ip -n "$SW" link set lo up
sh_or_fail ip -n "$SW" link add br0 type bridge
sh_or_fail ip -n "$SW" link set br0 mtu "$MTU"
sh_or_fail ip -n "$SW" link set br0 up

# One host per endpoint: a namespace, eth0 inside with its address, its port on the bridge.
add_host() {
  local name=$1 ip=$2 ns="$PREFIX-$1"
  sh_or_fail ip netns add "$ns"
  sh_or_fail ip -n "$ns" link set lo up
  sh_or_fail ip -n "$SW" link add "$name" type veth peer name eth0 netns "$ns"
  sh_or_fail ip -n "$SW" link set "$name" mtu "$MTU"
  sh_or_fail ip -n "$ns" link set eth0 mtu "$MTU"
  sh_or_fail ip -n "$SW" link set "$name" master br0 up
  sh_or_fail ip -n "$ns" addr add "$ip/24" dev eth0
  sh_or_fail ip -n "$ns" link set eth0 up
}
add_host ctl "$SUBNET.1"
# The failover scenario: two controllers in high availability and etcd, each a host of its own
# (the driver stays in ctl, so cutting controller a's namespace leaves it the client).
case ",$SCENARIO," in
  *,failover,*)
    add_host ca "$SUBNET.2"
    add_host cb "$SUBNET.3"
    add_host etcd "$SUBNET.4"
    ;;
esac
for ((k = 0; k < TRAINER_NODES; k++)); do add_host "t$k" "$SUBNET.$((10 + k))"; done
for ((k = 0; k < AGENTS - TRAINER_NODES; k++)); do add_host "i$k" "$SUBNET.$((100 + k))"; done
log "$(our_namespaces "$PREFIX" | wc -l) namespaces ($PREFIX-*), $(($(our_namespaces "$PREFIX" | wc -l) - 1)) veth pairs (MTU $MTU) on a bridge in $SW, subnet $SUBNET.0/24"

# The committed steps' timeline goes to .cache/cluster-trace.json unless --timeline says otherwise.
timeline=()
case " $* " in
  *" --timeline "* | *" --timeline="*) ;;
  *) mkdir -p "$ROOT/.cache" 2>/dev/null && timeline=(--timeline "$ROOT/.cache/cluster-trace.json") ;;
esac
ip netns exec "$PREFIX-ctl" "$BIN/tests/cluster/wb-cluster" --ns-prefix "$PREFIX" --subnet "$SUBNET" \
  --bin-dir "$BIN" "${timeline[@]}" "$@"
rc=$?
exit $rc
