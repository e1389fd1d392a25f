#!/bin/bash
# wbctl plan --dry-run: prints the plan's fields for a config.json; bad input is one error, exit 2.
set -u
W=client/wbctl
M=tests/python/engine_configs
fail() { echo "FAIL: $*"; exit 1; }

out=$($W plan --dry-run --model $M/qwen3.json --engine vllm --trainers 4 --inference-gpus 8 --tp 4 --fp8) \
  || fail "qwen3 dry run exited $?"
for f in "dry run:" "ops" "sender" "receiver" "imbalance" "predicted step time" '"total_bytes"' \
         '"predicted_step_seconds"' '"sender_nics"'; do
  grep -qF -- "$f" <<<"$out" || fail "qwen3 dry run lacks '$f': $out"
done
out=$($W plan --dry-run --model $M/deepseek_v3.json --engine sglang --trainers 4 --inference-gpus 8 --tp 4 --ep 2 --fp8) \
  || fail "deepseek_v3 dry run exited $?"
grep -qF '"total_bytes"' <<<"$out" || fail "deepseek_v3 dry run lacks total_bytes"

expect_error() {  # expect_error WORD args...
  local word=$1; shift
  local err rc
  err=$($W plan --dry-run "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" = 2 ] || fail "expected exit 2, got $rc for $*: $err"
  [ "$(wc -l <<<"$err")" = 1 ] || fail "expected one error line for $*: $err"
  grep -qiF -- "$word" <<<"$err" || fail "error for $* does not mention '$word': $err"
}
echo '{"architectures":["FooForCausalLM"],"hidden_size":64}' > "$TEST_TMPDIR/foo.json"
expect_error "unknown architecture" --model "$TEST_TMPDIR/foo.json" --engine vllm --trainers 4 --inference-gpus 8 --tp 4
expect_error "tp 3" --model $M/qwen3.json --engine vllm --trainers 4 --inference-gpus 6 --tp 3
# Megatron-core trainers (tp x pp x dp GPUs, every data-parallel copy a source).
out=$($W plan --dry-run --model $M/qwen3_moe.json --engine vllm --trainer megatron --trainer-tp 2 \
  --trainer-pp 2 --trainer-ep 2 --trainer-dp 2 --inference-gpus 4 --tp 2 --fp8) \
  || fail "megatron dry run exited $?"
grep -qF "8 megatron trainers" <<<"$out" || fail "megatron dry run lacks its trainers: $out"
grep -qF '"trainer":"megatron"' <<<"$out" || fail "megatron dry run lacks the trainer field"
expect_error "num_query_groups" --model $M/llama.json --engine vllm --trainer megatron \
  --trainer-tp 4 --inference-gpus 2 --tp 2
expect_error "expected fsdp or megatron" --model $M/llama.json --engine vllm --trainer deepspeed \
  --inference-gpus 2 --tp 2
# Relays: one trainer node feeding 8 replicas (4 agents of 2) is trainer-bound, so later replicas
# are fed by earlier ones; 64 trainers into 4 replicas are not, and nothing is relayed.
out=$($W plan --dry-run --model $M/qwen3.json --engine vllm --trainers 2 --inference-gpus 32 --tp 4 \
  --fp8 --relays --json) || fail "relay dry run exited $?"
python3 - "$out" <<'PY' || fail "relay dry run: $out"
import json, sys
r = json.loads(sys.argv[1])["relays"]
assert r["roots"] >= 1 and r["depth"] >= 1, r
assert r["receiver_limit_seconds"] <= r["predicted_seconds"] < r["predicted_without_relays_seconds"], r
fed = {a["agent"]: a for a in r["agents"]}
assert any(a["fed_by"] == "senders" for a in r["agents"]), r
for a in r["agents"]:
    assert a["bytes"] > 0 and a["ops"] > 0 and a["children"], a
    assert a["fed_by"] == "senders" or a["fed_by"] in fed, a  # a relay's parent relays too
assert sum(a["bytes"] for a in r["agents"]) == r["relayed_bytes"], r
PY
out=$($W plan --dry-run --model $M/qwen3.json --engine vllm --trainers 64 --inference-gpus 16 --tp 4 \
  --fp8 --relays) || fail "receiver-bound relay dry run exited $?"
grep -qF "relays: none" <<<"$out" || fail "receiver-bound dry run relays: $out"
# The tables' text above, and a JSON line whose relays are JSON too (not the tables' text).
tail -1 <<<"$out" | python3 -c 'import json, sys; r = json.load(sys.stdin)["relays"]; assert r["roots"] == 0, r' ||
  fail "the last line of a relay dry run is not JSON with its relays: $(tail -1 <<<"$out")"
out=$($W plan --dry-run --model $M/qwen3.json --engine vllm --trainers 2 --inference-gpus 32 --tp 4 --json)
grep -qF '"relays":{' <<<"$out" && fail "a relay report without --relays: $out"
echo PASS
