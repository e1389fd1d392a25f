#!/usr/bin/env bash
# Compares the tcp transport with iperf3 on loopback, same number of streams:
#   tests/bench/compare_tcp.sh [STREAMS] [ROUNDS]
# Runs both alternately ROUNDS times (default 3; shared machines are noisy), prints every
# figure and the ratio of the medians in GB/s. Extra bench flags: BENCH_FLAGS="--msg=... ".
set -euo pipefail
cd "$(dirname "$0")/../.."
STREAMS=${1:-4}
ROUNDS=${2:-3}
PORT=${IPERF_PORT:-5299}
PY=/usr/bin/python3

bazel build --jobs=2 -c opt //tests/bench:transport_bench >&2
BENCH="$(bazel info -c opt bazel-bin 2>/dev/null)/tests/bench/transport_bench"

ours=()
theirs=()
for round in $(seq "$ROUNDS"); do
  line=$("$BENCH" --transport=tcp --streams="$STREAMS" --bytes=$((8 << 30)) ${BENCH_FLAGS:-})
  echo "transport_bench: $line"
  ours+=("$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["gbps"])' "$line")")

  iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
  server=$!
  sleep 0.5
  gbps=$(iperf3 -c 127.0.0.1 -p "$PORT" -P "$STREAMS" -t 5 -J |
    $PY -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)')
  wait "$server" || true
  echo "iperf3 -P $STREAMS: $gbps GB/s"
  theirs+=("$gbps")
done

$PY - "${ours[*]}" "${theirs[*]}" "$STREAMS" <<'PYEOF'
import json, statistics, sys
ours = [float(x) for x in sys.argv[1].split()]
theirs = [float(x) for x in sys.argv[2].split()]
o, t = statistics.median(ours), statistics.median(theirs)
print(json.dumps({"streams": int(sys.argv[3]), "tcp_gbps_median": round(o, 3),
                  "iperf3_gbps_median": round(t, 3), "ratio": round(o / t, 3)}))
PYEOF
