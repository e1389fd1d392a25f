#!/usr/bin/env bash
# wb-local up|down|status: a weightbeam controller and two agents on this machine, in the
# background: train-0 (the trainer node) and infer-0 (the inference node), on loopback.
# From a checkout (`./wb up` / `./wb down`) it runs the daemons from bazel-bin; installed from
# the .deb (/usr/bin/wb-local) it runs /usr/bin's. Then client/python/examples/train_loop.py and
# inference_worker.py, in two terminals, move weights between them (`up` prints both commands).
#   WB_UP_DIR: where configs, sockets, logs and pids go (removed by `down`)
set -euo pipefail

self=$(readlink -f "$0")
here=$(dirname "$self")
uid=$(id -u)
if [ -n "${WB_BIN_DIR:-}" ]; then  # tests: Bazel's runfiles (binaries and sources in one tree)
  bin_controller="$WB_BIN_DIR/controller/wb-controller"
  bin_agent="$WB_BIN_DIR/daemon/wb-agent"
  bin_wbctl="$WB_BIN_DIR/client/wbctl"
  examples="${WB_SRC_DIR:-$WB_BIN_DIR}/client/python/examples"
  pythonpath="$WB_BIN_DIR/client/python"
  state="${WB_UP_DIR:?WB_UP_DIR must be set with WB_BIN_DIR}"
  how="wb-local.sh"
elif [ -f "$here/../WORKSPACE" ]; then  # a checkout: deploy/wb-local.sh
  root=$(cd "$here/.." && pwd)
  bin_controller="$root/bazel-bin/controller/wb-controller"
  bin_agent="$root/bazel-bin/daemon/wb-agent"
  bin_wbctl="$root/bazel-bin/client/wbctl"
  examples="$root/client/python/examples"
  pythonpath="$root/client/python:$root/bazel-bin/client/python"
  state="${WB_UP_DIR:-$root/.cache/up}"
  how="./wb"
else  # installed: /usr/bin/wb-local
  bin_controller="$here/wb-controller"
  bin_agent="$here/wb-agent"
  bin_wbctl="$here/wbctl"
  examples=/usr/share/doc/weightbeam/examples/python
  pythonpath=""  # the wheel: pip install weightbeam-*.whl
  state="${WB_UP_DIR:-${XDG_RUNTIME_DIR:-/tmp}/wb-local-$uid}"
  how="wb-local"
fi
# Unix socket paths hold at most 107 bytes.
if [ ${#state} -gt 80 ]; then state="/tmp/wb-local-$uid"; fi
NAMES=(controller train-0 infer-0)

log() { printf '\033[1m[wb]\033[0m %s\n' "$*" >&2; }

alive() {  # alive NAME: the pid in NAME.pid runs one of our binaries
  local pid
  pid=$(cat "$state/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && grep -qa -- "--config" "/proc/$pid/cmdline" 2>/dev/null
}

if [ ! -x /usr/bin/python3 ]; then
  echo "wb-local: needs /usr/bin/python3 (apt-get install python3 python3-grpcio python3-protobuf python3-numpy)" >&2
  exit 1
fi

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

accepts() {  # accepts HOST:PORT
  /usr/bin/python3 -c 'import socket, sys; h, p = sys.argv[1].rsplit(":", 1)
sys.exit(socket.socket().connect_ex((h, int(p))))' "$1"
}

print_usage_lines() {
  # shellcheck disable=SC1091
  . "$state/env"
  local py="${pythonpath:+PYTHONPATH=$pythonpath }/usr/bin/python3"
  cat <<EOF

weightbeam is up: controller $WB_CONTROLLER, agents train-0 and infer-0 (state in $state)
  controller  $WB_CONTROLLER         log $state/controller.log  metrics http://$WB_CONTROLLER_METRICS/metrics
  train-0     $WB_TRAINER_SOCKET   log $state/train-0.log     metrics http://$WB_TRAINER_METRICS/metrics
  infer-0     $WB_INFERENCE_SOCKET   log $state/infer-0.log     metrics http://$WB_INFERENCE_METRICS/metrics
In one terminal, the inference worker (prints each commit and checks its checksum):
  $py $examples/inference_worker.py --socket $WB_INFERENCE_SOCKET --checksum-dir $state
In another, the training loop (plans, then pushes a version a second):
  $py $examples/train_loop.py --socket $WB_TRAINER_SOCKET --controller $WB_CONTROLLER --steps 10 --interval 1 --checksum-dir $state
Look: WB_CONTROLLER=$WB_CONTROLLER $bin_wbctl status      Stop: $how down
(. $state/env sets WB_CONTROLLER, WB_TRAINER_SOCKET, WB_INFERENCE_SOCKET${pythonpath:+, PYTHONPATH})
EOF
}

cmd_down() {
  local stopped=0
  for name in "${NAMES[@]}"; do
    if alive "$name"; then
      kill -TERM "$(cat "$state/$name.pid")" 2>/dev/null || true
      stopped=$((stopped + 1))
    fi
  done
  for _ in $(seq 50); do
    local left=0
    for name in "${NAMES[@]}"; do alive "$name" && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for name in "${NAMES[@]}"; do
    if alive "$name"; then kill -KILL "$(cat "$state/$name.pid")" 2>/dev/null || true; fi
  done
  rm -rf "$state"
  log "down: stopped $stopped process(es), removed $state"
}

start() {  # start NAME BINARY
  setsid "$2" --config "$state/$1.yaml" >"$state/$1.log" 2>&1 </dev/null &
  echo $! >"$state/$1.pid"
}

wait_for() {  # wait_for WHAT COMMAND...
  local what=$1
  shift
  for _ in $(seq 200); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  log "up: $what did not come up within 20 s; its log:"
  return 1
}

cmd_up() {
  for b in "$bin_controller" "$bin_agent"; do
    [ -x "$b" ] || { log "up: $b is missing (./wb up builds it)" && exit 1; }
  done
  if alive controller; then
    log "up: already running"
    print_usage_lines
    return 0
  fi
  rm -rf "$state"
  mkdir -p "$state"
  local cport tport iport
  cport=$(free_port)
  cat >"$state/controller.yaml" <<EOF
# wb-local: one trainer rank (on train-0) -> one inference replica of one rank (on infer-0).
listen: 127.0.0.1:$cport
metrics_listen: 127.0.0.1:$(free_port)
heartbeat_timeout_ms: 3000
world:
  trainer_ranks: 1
  inference_replicas: 1
  inference_ranks_per_replica: 1
EOF
  for name in train-0 infer-0; do
    cat >"$state/$name.yaml" <<EOF
name: $name
local_socket: $state/$name.sock
listen: 127.0.0.1:$(free_port)
metrics_listen: 127.0.0.1:$(free_port)
controller: 127.0.0.1:$cport
heartbeat_interval_ms: 500
transports:
  tcp:
    listen: 127.0.0.1:0
executor:
  staging_watermark_bytes: 256MiB
EOF
  done
  metrics() { sed -n 's/^metrics_listen: //p' "$state/$1.yaml"; }
  cat >"$state/env" <<EOF
export WB_CONTROLLER=127.0.0.1:$cport
export WB_TRAINER_SOCKET=$state/train-0.sock
export WB_INFERENCE_SOCKET=$state/infer-0.sock
export WB_CONTROLLER_METRICS=$(metrics controller)
export WB_TRAINER_METRICS=$(metrics train-0)
export WB_INFERENCE_METRICS=$(metrics infer-0)
${pythonpath:+export PYTHONPATH=$pythonpath}
EOF
  start controller "$bin_controller"
  if ! wait_for "the controller" accepts "127.0.0.1:$cport"; then
    tail -n 20 "$state/controller.log" >&2
    cmd_down
    exit 1
  fi
  start train-0 "$bin_agent"
  start infer-0 "$bin_agent"
  for name in train-0 infer-0; do
    if ! wait_for "agent $name" test -S "$state/$name.sock"; then
      tail -n 20 "$state/$name.log" >&2
      cmd_down
      exit 1
    fi
  done
  print_usage_lines
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status)
    if ! alive controller; then
      log "not up ($how up starts it)"
      exit 1
    fi
    # shellcheck disable=SC1091
    . "$state/env"
    exec "$bin_wbctl" --controller "$WB_CONTROLLER" status
    ;;
  env) cat "$state/env" ;;
  *)
    echo "usage: $how up|down|status|env   a controller and two agents on this machine" >&2
    exit 2
    ;;
esac
