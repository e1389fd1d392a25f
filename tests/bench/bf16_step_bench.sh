#!/usr/bin/env bash
# A BF16 step against the transport's own rate, on this machine, in one run:
#   tests/bench/bf16_step_bench.sh [STREAMS] [ROUNDS] [STEPS]
# Each round is wb-demo --bf16: real agents and controller on loopback over tcp (STREAMS
# connections per peer), Qwen3-0.6B's HF tensors as FSDP dim-0 shards of 4 trainer ranks -> one
# vLLM replica of TP 2 holding BF16 parameters (1.19 GB per step), STEPS steps (default 6), every
# inference worker checking every byte after each commit. transport_bench (tcp, STREAMS
# connections, 8 GiB) runs before and after every round, so a shared machine's noise falls on
# both. Prints one JSON line on stdout (progress on stderr): bytes per step, seconds per step
# (min / median over every step but each round's first), GB/s, transport_bench's GB/s (median)
# and their ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
STREAMS=${1:-4}
ROUNDS=${2:-3}
STEPS=${3:-6}
PY=/usr/bin/python3

bazel build --jobs=2 -c opt //tests/bench:transport_bench //tests/demo:wb-demo //daemon:wb-agent \
  //controller:wb-controller >&2
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
load_before=$(cat /proc/loadavg)

transport=()
steps=()
measure_transport() {
  local line
  line=$("$BIN/tests/bench/transport_bench" --transport=tcp --streams="$STREAMS" --bytes=$((8 << 30)))
  echo "transport_bench: $line" >&2
  transport+=("$line")
}
measure_transport
for round in $(seq "$ROUNDS"); do
  line=$("$BIN/tests/demo/wb-demo" --bin-dir "$BIN" --bf16 --steps "$STEPS" --streams "$STREAMS" \
    --json 2>/dev/null) || { echo "round $round: wb-demo failed: $line" >&2; exit 1; }
  echo "round $round: wb-demo --bf16: $line" >&2
  steps+=("$line")
  measure_transport  # before and after every round
done

$PY - "$STREAMS" "$load_before" "$(cat /proc/loadavg)" "${#transport[@]}" "${transport[@]}" \
  "${steps[@]}" <<'PYEOF'
import json, statistics, sys
streams, before, after, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
transport = [json.loads(x) for x in sys.argv[5:5 + n]]
demos = [json.loads(x) for x in sys.argv[5 + n:]]
timed = [s for d in demos for s in d["seconds_per_step"][1:]]
bytes_per_step = demos[0]["bytes_per_step"]
median = statistics.median(timed)
step_gbps = bytes_per_step / median / 1e9
tcp_gbps = statistics.median(t["gbps"] for t in transport)
load = lambda s: [float(x) for x in s.split()[:3]]
print(json.dumps({
    "bench": "bf16_step", "model": "qwen3-0.6b", "trainers": demos[0]["trainers"],
    "tp": demos[0]["tp"], "destinations": "bf16", "transport": "tcp", "streams": streams,
    "rounds": len(demos), "steps_per_round": demos[0]["steps"],
    "verified": all(d["verified"] for d in demos),
    "bytes_per_step": bytes_per_step, "ops_per_step": demos[0]["last_step_senders"][0]["ops"],
    "seconds_min": round(min(timed), 4), "seconds_median": round(median, 4),
    "gbps_best": round(bytes_per_step / min(timed) / 1e9, 3), "gbps_median": round(step_gbps, 3),
    "transport_gbps": [round(t["gbps"], 3) for t in transport],
    "transport_gbps_median": round(tcp_gbps, 3), "ratio": round(step_gbps / tcp_gbps, 3),
    "loadavg_before": load(before), "loadavg_after": load(after)}))
PYEOF
