#!/usr/bin/env bash
# Suites that run outside `bazel test`: the end-to-end demo and the Soft-RoCE VM suite.
# Called by ./wb test after the Bazel tests.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0
log() { printf '[wb] %s\n' "$*" >&2; }
# Seconds each suite took, printed at the end: CI's budget (30 minutes for ./wb test on a fresh
# 2-core machine) is spent here and in the Bazel build; the figures say where.
TIMES=()
mark=$SECONDS
took() { TIMES+=("$1 $((SECONDS - mark)) s"); mark=$SECONDS; }

log "repository checks (tests/checks): layers, paths a reader can follow, --help with nothing set up"
if tests/checks/check_layers.sh; then log "layers: PASS"; else log "layers: FAIL"; failed=1; fi
if tests/checks/check_paths.py; then log "paths: PASS"; else log "paths: FAIL"; failed=1; fi
if tests/checks/check_help.sh; then log "help: PASS"; else log "help: FAIL"; failed=1; fi
if tests/checks/check_deploy.py; then log "deploy: PASS"; else log "deploy: FAIL"; failed=1; fi
if tests/checks/check_dashboard.py; then log "dashboard: PASS"; else log "dashboard: FAIL"; failed=1; fi
took checks

# The install test (./wb package --check, docs/install.md): the .deb, wheel and sdist built into
# .cache/test-dist, then installed into a fresh Debian bookworm root (cached in
# ~/.cache/weightbeam; SKIPPED without debootstrap or Debian's archive). WB_SKIP_INSTALL=1 skips.
# Making that root takes ~10 minutes once, so a machine without it runs the check only when
# asked (WB_INSTALL_CHECK=1, or ./wb package --check by hand): ./wb test stays within its time.
if [ "${WB_SKIP_INSTALL:-0}" = 1 ]; then
  log "install: SKIPPED (WB_SKIP_INSTALL=1)"
elif [ "${WB_INSTALL_CHECK:-0}" != 1 ] &&
    [ ! -f "${WB_CACHE_DIR:-$HOME/.cache/weightbeam}/bookworm-minbase.tar.gz" ]; then
  log "install: SKIPPED (no cached Debian root yet: ./wb package --check makes it once, ~10 min; or WB_INSTALL_CHECK=1 ./wb test)"
else
  log "install test (./wb package --check): .deb and wheel into a fresh Debian bookworm root"
  WB_INSTALL_SKIP_RC=77 deploy/package.sh --check --out .cache/test-dist
  case $? in
    0) log "install: PASS" ;;
    77) log "install: SKIPPED (see the line above)" ;;
    *) log "install: FAIL"; failed=1 ;;
  esac
  rm -rf .cache/test-dist
fi
took install

log "end-to-end demo (./wb demo): Qwen3-0.6B shape over tcp, verified bit for bit"
if tests/demo/demo.sh --steps 3; then log "demo: PASS"; else log "demo: FAIL"; failed=1; fi
took demo

log "demo with capture and staged receive (./wb demo --capture --staged): trainers move on once captured"
if tests/demo/demo.sh --steps 3 --capture --staged; then log "demo nobody-waits: PASS"; else log "demo nobody-waits: FAIL"; failed=1; fi
took demo-nobody-waits

log "cluster in miniature (./wb cluster, short): 8 agents in network namespaces, shaped links, every scenario"
if [ "$(id -u)" -ne 0 ] || ! ip netns list >/dev/null 2>&1; then
  log "cluster: SKIPPED (needs root and ip netns)"
elif tests/cluster/short.sh; then log "cluster: PASS"; else log "cluster: FAIL"; failed=1; fi
took cluster

# The real-engine and real-trainer suites, each skipped by its WB_SKIP_<NAME>=1; their per-case
# lines ("[wb] <name> <case> (<s> s): PASS|FAIL") are counted by ./wb test.
python_suite() {  # NAME SCRIPT WHAT
  local skip="WB_SKIP_${1^^}"
  if [ "${!skip:-0}" = 1 ]; then
    log "$1: SKIPPED ($skip=1)"
  else
    log "$3"
    if "$2"; then log "$1 suite: PASS"; else log "$1 suite: FAIL"; failed=1; fi
  fi
  took "$1"
}
# docs/engines.md "Proof inside a real vLLM": installs the pinned engine packages into
# .cache/venv-engines once, then a real vLLM (CPU) per case.
python_suite vllm tests/vllm/run.sh \
  "real engines (tests/vllm): vLLM's CPU build with the weightbeam backend, an FSDP2 trainer, log-probs against transformers"
# docs/trainers.md "Registering a real DTensor model": FSDP2, HSDP, FSDP2 + TP registered from
# the model, two versions checked byte for byte in vLLM layouts (BF16, FP8); the vLLM venv.
python_suite trainers tests/trainers/run.sh \
  "real DTensor trainers (tests/trainers): FSDP2, HSDP, FSDP2 + TP on gloo, registered from the model, bytes against full_tensor()"
# docs/trainers.md "Megatron-core from the model": TP 2, uneven PP 2, EP 2 against Megatron's
# own dist checkpoint; megatron-core in .cache/venv-megatron beside the vLLM venv.
python_suite megatron tests/megatron/run.sh \
  "real Megatron-core models (tests/megatron): TP, uneven PP, EP on gloo, registered from the model, bytes against Megatron's dist checkpoint"

if [ -x tests/fuzz/run.sh ]; then
  log "fuzzing (bounded): tcp frames, config, registrations, plan ops, storage manifests, step-link frames, model configs; 10 s each"
  if tests/fuzz/run.sh --seconds 10; then log "fuzz: PASS"; else log "fuzz: FAIL"; failed=1; fi
  took fuzz
fi

if [ -x tests/rxe/run_suite.sh ]; then
  log "RDMA suite inside the Soft-RoCE VM"
  # The rdma-vs-ib_write_bw benchmark is left to `tests/rxe/run_suite.sh` (see README).
  vm_out=$(mktemp)
  if tests/rxe/run_suite.sh --no-bench 2>&1 | tee "$vm_out"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
    log "RDMA VM suite: PASS"
  else
    log "RDMA VM suite: FAIL"
    failed=1
  fi
  # The step fence over rdma, counted on its own (the suite runs it as a named section).
  if grep -q '^rdma fence case: PASS' "$vm_out"; then
    log "rdma step fence case (VM): PASS"
  else
    log "rdma step fence case (VM): FAIL"
    failed=1
  fi
  rm -f "$vm_out"
  took rdma-vm
fi
# One line per suite, "[wb] time: <suite> <s> s": ./wb test prints them as a table at the end.
for t in "${TIMES[@]}"; do log "time: $t"; done
exit $failed
