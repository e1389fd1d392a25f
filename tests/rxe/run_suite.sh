#!/usr/bin/env bash
# All RDMA tests, in one Soft-RoCE VM boot: builds what they need on the host (bazel --jobs=2),
# then inside tests/rxe/vm.sh runs
#   1. the shared transport suite with WB_TEST_TRANSPORT=rdma on rxe0 (its [remote] cases fork a
#      receiver: two processes on rxe0),
#   2. the rdma device tests (multi-rail rxe0+rxe1, credits, error completions, vanished peer,
#      landing notices), and relays over rdma (a chain and a tree of agents on rxe0, rdma_relay_test),
#   3. the end-to-end demo with --transport=rdma (both agents on rxe0), dense and --delta,
#   4. ib_write_bw and transport_bench --transport=rdma at 1 MiB messages on rxe0, side by side
#      (printed, never failing the run: speed lives in benchmarks).
# Exit status: non-zero when a test failed. Usage: tests/rxe/run_suite.sh [--no-bench]
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGETS=(//tests/transport:transport_suite //tests/bench:transport_bench
  //tests/rxe:rdma_device_test //tests/rxe:rdma_relay_test //tests/rxe:rdma_write_bench
  //tests/demo:wb-demo
  //daemon:wb-agent //controller:wb-controller)
echo "[rxe] bazel build ${TARGETS[*]}" >&2
bazel build --jobs=2 "${TARGETS[@]}" >&2

export WB_RXE_BENCH=1
[ "${1:-}" = "--no-bench" ] && WB_RXE_BENCH=0
exec tests/rxe/vm.sh -- tests/rxe/in_vm_suite.sh
