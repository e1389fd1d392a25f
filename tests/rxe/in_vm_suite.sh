#!/usr/bin/env bash
# Runs inside the Soft-RoCE VM (started by tests/rxe/run_suite.sh): the RDMA tests, then the
# ib_write_bw / transport_bench comparison on rxe0.
set -uo pipefail
BIN=bazel-bin
failed=0

section() { printf '\n=== %s ===\n' "$*"; }

# need FILE...: each must be an executable here; otherwise say which, where bazel-bin points and
# why it may be missing, and fail the suite.
need() {
  local f ok=0
  for f in "$@"; do
    [ -x "$f" ] && continue
    ok=1
    failed=1
    if [ -e "$BIN" ]; then
      echo "missing inside the VM: $f (bazel-bin -> $(readlink -f "$BIN")): not built on the host?" \
        "tests/rxe/run_suite.sh builds every target this suite runs"
    else
      echo "missing inside the VM: $f: bazel-bin -> $(readlink "$BIN" 2>/dev/null || echo '(no link)')" \
        "is not visible here (tests/rxe/vm.sh maps the repository and Bazel's output base into" \
        "the guest; see the [vm] lines above)"
    fi
  done
  return $ok
}

section "shared transport suite, WB_TEST_TRANSPORT=rdma on rxe0"
need "$BIN/tests/transport/transport_suite" &&
  { WB_TEST_TRANSPORT=rdma WB_TEST_RDMA_DEVICE=rxe0 timeout 600 \
    "$BIN/tests/transport/transport_suite" --use-colour no || failed=1; }

# The step fence over rdma on its own (issue 31): one-sided writes cannot be refused by step,
# so an aborted step's incoming queue pairs are cut; the case is named here so that its result
# is visible by itself, not only inside the suite above.
section "step fence over rdma (rxe0): an aborted step's incoming connections are cut"
if need "$BIN/tests/transport/transport_suite"; then
  # By name, and a case without assertions fails (the case returns early on another backend).
  if WB_TEST_TRANSPORT=rdma WB_TEST_RDMA_DEVICE=rxe0 timeout 300 \
    "$BIN/tests/transport/transport_suite" --use-colour no --warn NoAssertions \
    "rdma: an aborted step's incoming connections are cut"; then
    echo "rdma fence case: PASS"
  else
    echo "rdma fence case: FAIL"
    failed=1
  fi
fi

# One registration per buffer over rdma (issue 32), named here so that its result is visible by
# itself: a withdrawn tensor inside a still-registered buffer cannot be written (the buffer is
# registered afresh, the old rkey fails at the NIC), and the rdma registrations do not grow with
# the tensor count.
section "one registration per buffer over rdma (rxe0): withdrawn tensors, registration count"
if need "$BIN/tests/transport/transport_suite"; then
  if WB_TEST_TRANSPORT=rdma WB_TEST_RDMA_DEVICE=rxe0 timeout 300 \
    "$BIN/tests/transport/transport_suite" --use-colour no --warn NoAssertions "[buffer]"; then
    echo "rdma buffer cases: PASS"
  else
    echo "rdma buffer cases: FAIL"
    failed=1
  fi
fi

section "rdma device tests (rxe0, rxe0+rxe1 rails)"
need "$BIN/tests/rxe/rdma_device_test" &&
  { timeout 600 "$BIN/tests/rxe/rdma_device_test" --use-colour no || failed=1; }

# Relays over rdma (issue 30): the landing notices tell a relay what landed by one-sided writes;
# a chain trainer -> infer-0 -> infer-1 -> infer-2 and a tree (fan-out 2) on rxe0, every byte
# compared.
section "relays over rdma (rxe0): a chain and a tree of four replicas, forwarded as bytes land"
need "$BIN/tests/rxe/rdma_relay_test" "$BIN/daemon/wb-agent" "$BIN/controller/wb-controller" &&
  { timeout 600 "$BIN/tests/rxe/rdma_relay_test" --use-colour no || failed=1; }

DEMO_BINS=("$BIN/tests/demo/wb-demo" "$BIN/daemon/wb-agent" "$BIN/controller/wb-controller")
section "end-to-end demo over rdma (rxe0): ./wb demo --transport=rdma, 1 layer, 2 steps"
if [ "${WB_RXE_DEMO:-1}" = "1" ] && need "${DEMO_BINS[@]}"; then
  timeout 900 "$BIN/tests/demo/wb-demo" --bin-dir "$BIN" --transport=rdma --rdma-device rxe0 \
    --layers 1 --steps 2 || failed=1
fi

section "delta mode over rdma (rxe0): packed records into receive slots, 1 layer, 3 steps"
if [ "${WB_RXE_DEMO:-1}" = "1" ] && need "${DEMO_BINS[@]}"; then
  timeout 900 "$BIN/tests/demo/wb-demo" --bin-dir "$BIN" --transport=rdma --rdma-device rxe0 \
    --delta --layers 1 --steps 3 || failed=1
fi

# ib_write_bw: the server waits for one client; the client retries until the server listens.
ib_write_bw_once() {
  local args=(-d rxe0 -x 1 -s 1048576 -n "$1" -F)
  timeout 120 ib_write_bw "${args[@]}" >/dev/null 2>&1 &
  local server=$!
  local out=""
  for _ in $(seq 1 20); do
    sleep 1
    if out=$(timeout 120 ib_write_bw "${args[@]}" 127.0.0.1 2>&1); then break; fi
    out=""
  done
  wait "$server" 2>/dev/null
  # "#bytes #iterations BW-peak BW-average MsgRate": the average, MB/s (10^6 bytes).
  awk '/^ *1048576 /{print $4}' <<<"$out" | tail -n1
}

if [ "${WB_RXE_BENCH:-1}" = "1" ]; then
  section "ib_write_bw vs transport_bench --transport=rdma, 1 MiB messages on rxe0"
  MIB=100
  for round in 1 2; do
    ibw=$(ib_write_bw_once "$MIB")
    echo "ib_write_bw -d rxe0 -x 1 -s 1048576 -n $MIB -F: ${ibw:-failed} MB/s"
    need "$BIN/tests/bench/transport_bench" || break
    tb=$(timeout 300 "$BIN/tests/bench/transport_bench" --transport=rdma --device=rxe0 \
      --msg=1048576 --bytes=$((MIB << 20)) 2>&1 | tail -n1)
    echo "transport_bench --transport=rdma --device=rxe0 --msg=1048576 --bytes=$((MIB << 20)): $tb"
    mbs=$(sed -n 's/.*"gbps":\([0-9.e+-]*\).*/\1/p' <<<"$tb")
    if [ -n "$ibw" ] && [ -n "$mbs" ]; then
      awk -v ibw="$ibw" -v g="$mbs" -v r="$round" 'BEGIN {
        printf "{\"bench\":\"rxe0_1MiB\",\"round\":%d,\"ib_write_bw_MBps\":%.2f,\"transport_bench_MBps\":%.2f,\"ratio\":%.3f}\n",
          r, ibw, g * 1000, g * 1000 / ibw }'
    fi
  done
fi

section "result"
if [ $failed -ne 0 ]; then echo "RDMA tests FAILED"; else echo "RDMA tests passed"; fi
exit $failed
