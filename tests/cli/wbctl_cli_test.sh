#!/bin/bash
# wbctl's command-line habits (docs/cli.md): global flags after the subcommand, `wbctl version`,
# `wbctl completion bash` (valid bash that completes subcommands, flags and choices), the
# documented exit codes (0 done, 1 nothing to show, 2 failed, 64 usage), and docs/cli.md naming
# every subcommand the parser knows.
set -u
W=client/wbctl
M=tests/python/engine_configs/qwen3.json
VERSION=$(tr -d ' \n' <VERSION)
fail() { echo "FAIL: $*"; exit 1; }

# Global flags after the subcommand: --json at the end of a dry run prints one JSON object only.
out=$($W plan --dry-run --model $M --engine vllm --trainers 4 --inference-gpus 8 --tp 4 --json) ||
  fail "plan --dry-run ... --json exited $?"
[ "$(wc -l <<<"$out")" = 1 ] && [[ "$out" == '{"model":'* ]] || fail "--json after the subcommand: $out"
out2=$($W --json plan --dry-run --model $M --engine vllm --trainers 4 --inference-gpus 8 --tp 4)
[ "$out" = "$out2" ] || fail "--json before and after the subcommand differ"
# --controller after the subcommand is the one used (an unreachable one: exit 2, named in the error).
err=$($W status --controller 127.0.0.1:1 2>&1 >/dev/null); rc=$?
[ "$rc" = 2 ] || fail "status against a closed port exited $rc: $err"
[ "$(wc -l <<<"$err")" = 1 ] || fail "expected one error line: $err"
err=$(WB_CONTROLLER=127.0.0.1:1 $W tensors --agent a --controller 127.0.0.1:2 --json 2>&1); rc=$?
[ "$rc" = 2 ] || fail "tensors ... --controller exited $rc: $err"

# version: no controller needed.
out=$($W version) || fail "wbctl version exited $?"
[[ "$out" =~ ^wbctl\ $VERSION\ \(commit\ [0-9a-z-]+\)$ ]] || fail "wbctl version: $out"
out=$($W version --json) || fail "wbctl version --json exited $?"
[[ "$out" == "{\"program\":\"wbctl\",\"version\":\"$VERSION\",\"commit\":\""*'"}' ]] ||
  fail "wbctl version --json: $out"

# Usage errors: 64.
for args in "bogus" "plan --no-such-flag" "step" "step notanumber" "completion zsh" ""; do
  # shellcheck disable=SC2086
  $W $args >/dev/null 2>&1
  rc=$?
  [ "$rc" = 64 ] || fail "'wbctl $args' exited $rc, expected 64"
done
$W --help >/dev/null || fail "--help exited $?"
$W plan --help | grep -q -- "--dry-run" || fail "plan --help lacks --dry-run"

# completion bash: parses, and completes what the parser accepts.
script=$($W completion bash) || fail "completion bash exited $?"
bash -n <<<"$script" || fail "completion script is not valid bash"
complete_words() {  # complete_words WORD... : what <TAB> offers after these words
  bash -c 'eval "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _wbctl
           printf "%s\n" "${COMPREPLY[@]}"' _ "$script" wbctl "$@"
}
got=$(complete_words "")
for w in status agents tensors plan step trace watch version completion --json --controller; do
  grep -qx -- "$w" <<<"$got" || fail "completing 'wbctl ' lacks $w: $got"
done
got=$(complete_words plan --dr)
[ "$got" = "--dry-run" ] || fail "completing 'wbctl plan --dr': $got"
got=$(complete_words plan --dry-run --j)
[ "$got" = "--json" ] || fail "global flags complete after a subcommand: $got"
got=$(complete_words plan --engine "")
[ "$(sort <<<"$got" | tr '\n' ' ')" = "sglang vllm " ] || fail "--engine choices: $got"
got=$(complete_words step --max)
[ "$got" = "--max-staleness" ] || fail "step flags: $got"
got=$(complete_words completion "")
[ "$got" = "bash" ] || fail "completion's shells: $got"

# docs/cli.md documents every subcommand the parser has, and its exit codes.
for sub in $(complete_words "" | grep -v '^-'); do
  grep -q "^| \`wbctl $sub" docs/cli.md || fail "docs/cli.md has no row for 'wbctl $sub'"
done
for code in 0 1 2 64; do
  grep -q "^| $code |" docs/cli.md || fail "docs/cli.md does not document exit code $code"
done
echo PASS
