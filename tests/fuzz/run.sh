#!/usr/bin/env bash
# Coverage-guided fuzzing of the tcp frame header parser, the YAML config loader, registration
# requests, plan ops as a sending agent checks them, storage manifests, step-link frames and
# config.json -> layouts, built outside Bazel with Debian's clang + libFuzzer (ASan + UBSan)
# against Debian's absl/yaml-cpp.
#
#   tests/fuzz/run.sh [--seconds N]
#                     [--target frame|config|registration|plan_op|manifest|steplink|model_config|landing_notice|trainer_layout]
#                     [--build-only]
#   (--seconds 0: only replay the seeds, a quick regression check)
#
# Each target first replays its checked-in corpus (tests/fuzz/corpus/<target>, regressions
# included), then fuzzes for N seconds (default 20). New inputs go to .cache/fuzz/corpus/<target>,
# crashes to .cache/fuzz/artifacts/. Exit status: 0 when every target ran clean, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=20
targets=(frame config registration plan_op manifest steplink model_config landing_notice trainer_layout)
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --target) targets=("$2"); shift 2 ;;
    --target=*) targets=("${1#*=}"); shift ;;
    --build-only) build_only=1; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "run.sh: --seconds wants a whole number, got '$seconds'" >&2
  exit 2
fi
# libFuzzer reads -max_total_time=0 as "no limit"; here 0 means: replay the seeds only.
time_flags=(-max_total_time="$seconds")
[ "$seconds" = 0 ] && time_flags=(-runs=0)

log() { printf '\033[1m[fuzz]\033[0m %s\n' "$*" >&2; }

CXX="${FUZZ_CXX:-/usr/bin/clang++}"
if [ ! -x "$CXX" ]; then
  log "$CXX not found: install Debian's clang and libclang-rt-14-dev (./wb deps)"
  exit 1
fi

out="${FUZZ_OUT:-.cache/fuzz}"  # FUZZ_OUT: e.g. a scratch folder for a mutated build
mkdir -p "$out/obj" "$out/artifacts"

# Project sources are instrumented for coverage too; the system libraries are not.
CXXFLAGS=(-std=c++17 -O1 -g -I. -I"$out/gen" -fno-omit-frame-pointer
  -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
  -fsanitize-ignorelist=tests/fuzz/ubsan_ignore.txt)
LINKFLAGS=(-fsanitize=fuzzer,address,undefined)
ABSL_LIBS=(-labsl_statusor -labsl_status -labsl_cord -labsl_cordz_info -labsl_cordz_handle
  -labsl_cordz_functions -labsl_cord_internal -labsl_str_format_internal -labsl_strings
  -labsl_strings_internal -labsl_int128 -labsl_throw_delegate -labsl_raw_logging_internal)

# Each fuzz target in one line: its name, libFuzzer's -max_len, the libraries beyond absl it
# links, and its sources.
declare -A SOURCES LIBS MAX_LEN
fuzz_target() {
  local name="$1"
  MAX_LEN[$name]="$2"
  LIBS[$name]="$3 ${ABSL_LIBS[*]}"
  shift 3
  SOURCES[$name]="$*"
}
fuzz_target frame 128 "" tests/fuzz/frame_fuzz.cc daemon/transport/tcp/frame.cc \
  daemon/transport/region_table.cc
fuzz_target config 4096 -lyaml-cpp tests/fuzz/config_fuzz.cc config/config.cc \
  config/yaml_reader.cc common/planner/name_rules.cc
fuzz_target registration 512 -lprotobuf tests/fuzz/registration_fuzz.cc \
  common/tensor/tensor_checks.cc common/tensor/dtype.cc "$out/gen/weightbeam/v1/types.pb.cc" \
  "$out/gen/weightbeam/v1/local.pb.cc"
fuzz_target plan_op 256 -lprotobuf tests/fuzz/plan_op_fuzz.cc daemon/executor/op_bounds.cc \
  common/tensor/tensor_checks.cc common/tensor/dtype.cc "$out/gen/weightbeam/v1/types.pb.cc"
fuzz_target manifest 2048 -lcrypto tests/fuzz/manifest_fuzz.cc daemon/storage/store_layout.cc \
  daemon/storage/manifest_mac.cc daemon/storage/safetensors.cc
fuzz_target steplink 4096 -lcrypto tests/fuzz/steplink_fuzz.cc common/steplink/link_cipher.cc
fuzz_target model_config 4096 "" tests/fuzz/model_config_fuzz.cc common/engines/model_config.cc \
  common/engines/engine_layout.cc common/planner/name_rules.cc common/planner/layout.cc
fuzz_target landing_notice 512 "" tests/fuzz/landing_notice_fuzz.cc \
  daemon/transport/rdma/landing_notice.cc
fuzz_target trainer_layout 4096 -lprotobuf tests/fuzz/trainer_layout_fuzz.cc \
  common/engines/engine_layout_proto.cc common/engines/trainer_layout.cc \
  common/engines/model_config.cc common/engines/engine_layout.cc common/planner/name_rules.cc \
  common/planner/layout.cc "$out/gen/weightbeam/v1/types.pb.cc" "$out/gen/weightbeam/v1/local.pb.cc"

# Recompiles a source when it, a project header, this script or the ignorelist is newer.
compile() {
  local src="$1" obj="$out/obj/${1//\//_}.o"
  if [ -f "$obj" ] && [ -z "$(find "$src" config common/engines common/tensor common/planner common/steplink daemon/executor daemon/transport daemon/storage tests/fuzz -newer "$obj" \
    \( -name '*.h' -o -path "$src" -o -name run.sh -o -name ubsan_ignore.txt \) -print -quit)" ]
  then
    echo "$obj"
    return 0
  fi
  log "compiling $src" >&2
  "$CXX" "${CXXFLAGS[@]}" -c "$src" -o "$obj" >&2 || return 1
  echo "$obj"
}

build() {
  local target="$1" objs=() obj
  for src in ${SOURCES[$target]}; do
    obj="$(compile "$src")" || return 1
    objs+=("$obj")
  done
  local bin="$out/${target}_fuzz"
  # shellcheck disable=SC2086  # LIBS entries are word lists
  "$CXX" "${LINKFLAGS[@]}" "${objs[@]}" ${LIBS[$target]} -o "$bin" || return 1
}

# daemon/transport/transport.h includes the generated types.pb.h; only the header is needed
# (region_table.cc uses no proto symbol), so nothing protobuf is compiled or linked.
# The registration and plan_op targets compile and link the generated messages themselves.
gen_header="$out/gen/weightbeam/v1/local.pb.h"
if [ ! -f "$gen_header" ] || [ proto/weightbeam/v1/types.proto -nt "$gen_header" ] ||
  [ proto/weightbeam/v1/local.proto -nt "$gen_header" ]; then
  mkdir -p "$out/gen"
  protoc -Iproto --cpp_out="$out/gen" proto/weightbeam/v1/types.proto \
    proto/weightbeam/v1/local.proto || {
    log "protoc failed (Debian's protobuf-compiler)"
    exit 1
  }
fi

# Every object first, FUZZ_JOBS (2) compilers at a time: on a fresh machine compiling is most
# of this script's time. A source that fails here is compiled again (and reported) by build.
jobs=${FUZZ_JOBS:-2}
declare -A queued
running=0
for target in "${targets[@]}"; do
  for src in ${SOURCES[$target]:-}; do
    [ -n "${queued[$src]:-}" ] && continue
    queued[$src]=1
    compile "$src" >/dev/null 2>&1 &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n
      running=$((running - 1))
    fi
  done
done
wait

failed=0
for target in "${targets[@]}"; do
  if [ -z "${SOURCES[$target]:-}" ]; then
    log "unknown target '$target' (frame, config, registration, plan_op, manifest, steplink, model_config, landing_notice, trainer_layout)"
    exit 2
  fi
  if ! build "$target"; then
    log "$target: BUILD FAILED"
    failed=1
    continue
  fi
  [ "$build_only" = 1 ] && continue

  seeds="tests/fuzz/corpus/$target"
  work="$out/corpus/$target"
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/$target.dict" ] && dict=("-dict=tests/fuzz/$target.dict")
  log "$target: replaying $(find "$seeds" -type f | wc -l) seeds$([ "$seconds" = 0 ] || echo ", then fuzzing ${seconds}s")"
  # The first corpus directory receives new inputs; the checked-in seeds stay untouched.
  if ASAN_OPTIONS="detect_leaks=1:abort_on_error=0" \
    "$out/${target}_fuzz" "$work" "$seeds" "${dict[@]}" \
    "${time_flags[@]}" -max_len="${MAX_LEN[$target]}" -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/artifacts/$target-" \
    </dev/null >"$out/$target.log" 2>&1; then
    log "$target: PASS ($(grep -E '^#[0-9]+.*DONE' "$out/$target.log" | tail -1))"
  else
    tail -n 40 "$out/$target.log" >&2
    log "$target: FAIL (full log: $out/$target.log; crashing inputs: $out/artifacts/$target-*)"
    failed=1
  fi
done
exit $failed
