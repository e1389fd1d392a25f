#!/usr/bin/env bash
# The install test (`./wb package --check`; tests/run_extra.sh runs it when dist/ is there):
#   1. a fresh Debian bookworm root: a debootstrap'ed minbase (with python3-venv, -grpcio,
#      -protobuf, -numpy), cached as ~/.cache/weightbeam/bookworm-minbase.tar.gz and unpacked
#      once next to it; each run gets a fresh overlay of it under /tmp (a fresh unpack where
#      overlayfs is missing); the .debs apt downloads are kept in ~/.cache/weightbeam/apt-archives;
#   2. `apt-get install ./weightbeam_*.deb` in a chroot (its Depends come from Debian's archive);
#   3. wb-controller and two wb-agents (train-0, infer-0) from /usr/bin with the installed
#      /etc/weightbeam configs adapted to loopback (no TLS, no RDMA), `wbctl status` sees both;
#   4. the wheel into a fresh `--system-site-packages` virtualenv with `pip install --no-index`,
#      and the installed Python examples (train_loop.py, inference_worker.py) against the
#      daemons: every commit arrives with the trainer's checksum; then wb-local up / status /
#      down (the installed ./wb up);
#   5. `apt-get remove` keeps the conffiles only, `apt-get purge` leaves none of the package's
#      files.
# Prints "[wb] install check: PASS|FAIL (N s)", or "SKIPPED (why)" and exits 0 when it cannot
# run here (not root, no debootstrap, Debian's archive unreachable).
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=$(realpath -m "${1:-dist}")
CACHE="${WB_CACHE_DIR:-$HOME/.cache/weightbeam}"
BASE="$CACHE/bookworm-minbase.tar.gz"
ARCHIVES="$CACHE/apt-archives"
MIRROR="${WB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
INCLUDE=python3-venv,python3-grpcio,python3-protobuf,python3-numpy,ca-certificates
VERSION=$(tr -d ' \n' <VERSION)
# What deploy/container/Containerfile installs next to the .deb (tests/checks/check_deploy.py
# keeps the two lists equal), so that this test resolves the image's package set too.
IMAGE_PACKAGES=(ibverbs-providers)
start=$SECONDS

log() { printf '[wb] %s\n' "$*" >&2; }
skip() {  # exit 0, or $WB_INSTALL_SKIP_RC (tests/run_extra.sh: 77, to report it as skipped)
  log "install check: SKIPPED ($*)"
  exit "${WB_INSTALL_SKIP_RC:-0}"
}
fail() {
  log "install check: FAIL after $((SECONDS - start)) s: $*"
  exit 1
}

[ "$(id -u)" = 0 ] || skip "needs root for chroot and mounts"
deb=$(ls "$DIST"/weightbeam_"$VERSION"_*.deb 2>/dev/null | head -n1 || true)
whl=$(ls "$DIST"/weightbeam-"$VERSION"-py3-none-any.whl 2>/dev/null | head -n1 || true)
[ -n "$deb" ] && [ -n "$whl" ] || fail "no weightbeam $VERSION .deb and wheel in $DIST (./wb package)"

work=$(mktemp -d /tmp/wb-install-XXXXXX)
root="$work/root"
pids=()
cleanup() {
  local pid m
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # Anything still running inside the root (a daemon's child, a stuck example).
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    if [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  sleep 0.2
  # Every mount under the work dir (ours, and debootstrap's /proc and /sys if it stopped midway).
  for m in $(findmnt -rn -o TARGET | grep -F "$work/" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  if findmnt -rn -o TARGET | grep -qF "$work/"; then
    log "install check: could not unmount everything under $work; left it in place"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

sources() {
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$MIRROR" "$MIRROR" "${MIRROR%/debian}/debian-security"
}

# 1. The Debian root: cached, else made now (minutes, once).
mkdir -p "$CACHE" "$ARCHIVES/partial"
if [ ! -f "$BASE" ]; then
  command -v debootstrap >/dev/null || skip "no debootstrap (apt-get install debootstrap)"
  log "install check: making the bookworm root with debootstrap from $MIRROR (once; cached as $BASE)"
  if ! debootstrap --variant=minbase --include="$INCLUDE" --cache-dir="$ARCHIVES" bookworm \
    "$work/base" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
    tail -n 5 "$work/debootstrap.log" >&2
    skip "debootstrap from $MIRROR failed: Debian's archive unreachable?"
  fi
  sources >"$work/base/etc/apt/sources.list"
  cp /etc/resolv.conf "$work/base/etc/resolv.conf" 2>/dev/null || true
  chroot "$work/base" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get update -q \
    >>"$work/debootstrap.log" 2>&1 || skip "apt-get update in the new root failed: Debian's archive unreachable?"
  mv "$work/base"/var/cache/apt/archives/*.deb "$ARCHIVES/" 2>/dev/null || true
  tar -C "$work/base" -czf "$BASE.part" . && mv "$BASE.part" "$BASE"
  rm -rf "$work/base"
fi
# The root: an overlay on the unpacked tarball (unpacked once into the cache), so that a run
# neither unpacks nor deletes 20,000 files; a plain unpack where overlayfs is not available.
unpacked="$CACHE/bookworm-minbase"
if [ ! -f "$unpacked/.from-tarball" ] || [ "$BASE" -nt "$unpacked/.from-tarball" ]; then
  rm -rf "$unpacked" && mkdir -p "$unpacked"
  tar -C "$unpacked" -xzf "$BASE" && touch "$unpacked/.from-tarball"
fi
mkdir -p "$root" "$work/upper" "$work/overlay-work"
if ! mount -t overlay overlay -o "lowerdir=$unpacked,upperdir=$work/upper,workdir=$work/overlay-work" \
  "$root" 2>/dev/null; then
  tar -C "$root" -xzf "$BASE"
fi
sources >"$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
mkdir -p "$root/dev/shm" "$root/var/cache/apt/archives"
mount -t tmpfs -o size=512m,mode=1777 tmpfs "$root/dev/shm"
mount --bind "$ARCHIVES" "$root/var/cache/apt/archives"
in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
log "install check: bookworm root ready in $((SECONDS - start)) s"

# 2. apt-get install ./weightbeam_*.deb, its dependencies from Debian's archive.
cp "$deb" "$whl" "$root/tmp/"
debname=$(basename "$deb")
if ! in_root apt-get install -y -q --no-install-recommends -o DPkg::Options::=--force-unsafe-io "/tmp/$debname" "${IMAGE_PACKAGES[@]}" >"$work/apt.log" 2>&1; then
  in_root apt-get update -q >>"$work/apt.log" 2>&1 || skip "Debian's archive unreachable (apt-get update failed)"
  if ! in_root apt-get install -y -q --no-install-recommends -o DPkg::Options::=--force-unsafe-io "/tmp/$debname" "${IMAGE_PACKAGES[@]}" >>"$work/apt.log" 2>&1; then
    tail -n 20 "$work/apt.log" >&2
    fail "apt-get install ./$debname"
  fi
fi
in_root dpkg-query -W -f='${Status} ${Version}\n' weightbeam | grep -q "install ok installed $VERSION" ||
  fail "weightbeam $VERSION is not installed"
log "install check: apt-get install ./$debname ${IMAGE_PACKAGES[*]}: $(grep -cE '^(Setting up|Unpacking) ' "$work/apt.log" || true) unpack/setup lines, $((SECONDS - start)) s"
in_root dpkg -L weightbeam >"$work/files"
for f in /usr/bin/wb-agent /usr/bin/wb-controller /usr/bin/wbctl /usr/bin/wb-local \
  /lib/systemd/system/wb-agent.service /lib/systemd/system/wb-controller.service \
  /etc/weightbeam/agent.yaml /etc/weightbeam/controller.yaml /usr/share/man/man1/wbctl.1.gz \
  /usr/share/man/man1/wb-agent.1.gz /usr/share/man/man1/wb-controller.1.gz \
  /usr/share/bash-completion/completions/wbctl; do
  grep -qx "$f" "$work/files" || fail "the package lacks $f"
done
conffiles=$(in_root dpkg-query -W -f='${Conffiles}\n' weightbeam | awk 'NF {print $1}' | sort | tr '\n' ' ')
[ "$conffiles" = "/etc/weightbeam/agent.yaml /etc/weightbeam/controller.yaml " ] ||
  fail "conffiles: '$conffiles'"
in_root getent group weightbeam >/dev/null || fail "postinst made no weightbeam group"
in_root getent passwd weightbeam >/dev/null || fail "postinst made no weightbeam user"
for b in wb-agent wb-controller; do
  line=$(in_root "/usr/bin/$b" --version)
  [[ "$line" =~ ^$b\ $VERSION\ \(commit\ [0-9a-f]{40}(-dirty)?\)$ ]] || fail "$b --version: '$line'"
done
line=$(in_root /usr/bin/wbctl version)
[[ "$line" =~ ^wbctl\ $VERSION\ \(commit\ [0-9a-f]{40}(-dirty)?\)$ ]] || fail "wbctl version: '$line'"
log "install check: $line"

# 3. The daemons from the installed paths, the installed configs adapted to loopback.
port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
drop_tls() { awk '/^tls:/ {skip = 1; next} skip && /^[ #]/ {next} {skip = 0; print}'; }
mkdir -p "$root/tmp/check"
cport=$(port)
sed -e "s/^listen: .*/listen: 127.0.0.1:$cport/" -e 's/trainer_ranks: .*/trainer_ranks: 1/' \
  -e 's/inference_replicas: .*/inference_replicas: 1/' \
  -e 's/inference_ranks_per_replica: .*/inference_ranks_per_replica: 1/' \
  "$root/etc/weightbeam/controller.yaml" | drop_tls >"$root/tmp/check/controller.yaml"
for name in train-0 infer-0; do
  sed -e "s/^name: .*/name: $name/" -e "s|^local_socket: .*|local_socket: /tmp/check/$name.sock|" \
    -e "s/^listen: .*/listen: 127.0.0.1:$(port)/" -e "s/^advertise_host: .*/advertise_host: 127.0.0.1/" \
    -e "s/^controller: .*/controller: 127.0.0.1:$cport/" -e "s/^  port: .*/  port: $(port)/" \
    -e 's/^    listen: .*/    listen: 127.0.0.1:0/' -e 's/^    enabled: true/    enabled: false/' \
    -e 's/staging_watermark_bytes: .*/staging_watermark_bytes: 64MiB/' \
    "$root/etc/weightbeam/agent.yaml" | drop_tls >"$root/tmp/check/$name.yaml"
  echo "heartbeat_interval_ms: 200" >>"$root/tmp/check/$name.yaml"
done
daemon() {  # daemon NAME BINARY
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin "$2" --config "/tmp/check/$1.yaml" \
    >"$work/$1.log" 2>&1 </dev/null &
  pids+=($!)
}
wait_for() {  # wait_for WHAT LOG COMMAND...
  local what=$1 logf=$2
  shift 2
  for _ in $(seq 300); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  tail -n 20 "$logf" >&2 || true
  fail "$what did not come up in 30 s"
}
accepts() { /usr/bin/python3 -c 'import socket, sys; sys.exit(socket.socket().connect_ex(("127.0.0.1", int(sys.argv[1]))))' "$1"; }
daemon controller /usr/bin/wb-controller
wait_for "wb-controller" "$work/controller.log" accepts "$cport"
daemon train-0 /usr/bin/wb-agent
daemon infer-0 /usr/bin/wb-agent
for name in train-0 infer-0; do
  wait_for "wb-agent $name" "$work/$name.log" test -S "$root/tmp/check/$name.sock"
  group=$(in_root stat -c %G "/tmp/check/$name.sock")
  [ "$group" = weightbeam ] || fail "$name's socket belongs to group $group, not weightbeam"
done
both() {
  in_root /usr/bin/wbctl status --controller "127.0.0.1:$cport" >"$work/status.txt" 2>&1 &&
    grep -q '^train-0 ' "$work/status.txt" && grep -q '^infer-0 ' "$work/status.txt"
}
wait_for "both agents in wbctl status" "$work/status.txt" both
log "install check: wbctl status (installed daemons, installed configs on loopback):"
sed 's/^/    /' "$work/status.txt" | head -n 8 >&2

# 4. The wheel in a fresh virtualenv, no network; the installed examples against the daemons.
wname=$(basename "$whl")
in_root python3 -m venv --system-site-packages /tmp/venv >"$work/venv.log" 2>&1 || fail "python3 -m venv"
if ! in_root /tmp/venv/bin/pip install -q --no-index --no-cache-dir "/tmp/$wname" >>"$work/venv.log" 2>&1; then
  cat "$work/venv.log" >&2
  fail "pip install --no-index $wname"
fi
got=$(in_root /tmp/venv/bin/python -c 'import weightbeam, weightbeam.v1.controller_pb2 as c
print(weightbeam.__version__, weightbeam.__file__)')
[[ "$got" == "$VERSION /tmp/venv/lib/python3"*"/site-packages/weightbeam/__init__.py" ]] ||
  fail "import weightbeam from the venv: '$got'"
log "install check: pip install --no-index $wname; import weightbeam: $got"
ex=/usr/share/doc/weightbeam/examples/python
in_root /tmp/venv/bin/python "$ex/inference_worker.py" --socket /tmp/check/infer-0.sock \
  --commits 2 --timeout 120 --checksum-dir /tmp/check >"$work/worker.log" 2>&1 &
worker=$!
pids+=("$worker")
for _ in $(seq 300); do grep -qs "waiting for commits" "$work/worker.log" && break; sleep 0.1; done
if ! in_root /tmp/venv/bin/python "$ex/train_loop.py" --socket /tmp/check/train-0.sock \
  --controller "127.0.0.1:$cport" --steps 2 --interval 0.5 --checksum-dir /tmp/check \
  >"$work/trainer.log" 2>&1; then
  cat "$work/trainer.log" >&2
  fail "train_loop.py"
fi
wait "$worker" || {
  cat "$work/worker.log" >&2
  fail "inference_worker.py"
}
[ "$(grep -c ', checksum OK;' "$work/worker.log")" = 2 ] || {
  cat "$work/worker.log" >&2
  fail "the worker did not see 2 commits with the trainer's checksums"
}
sed 's/^/    /' "$work/trainer.log" "$work/worker.log" >&2

for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
pids=()

# wb-local, the installed ./wb up: up, status sees both agents, down removes its state.
if ! in_root wb-local up >"$work/wb-local.log" 2>&1; then
  cat "$work/wb-local.log" >&2
  fail "wb-local up"
fi
in_root wb-local status >"$work/wb-local-status.log" 2>&1 || true
in_root wb-local down >>"$work/wb-local.log" 2>&1 || fail "wb-local down"
if ! grep -q "examples/python/inference_worker.py" "$work/wb-local.log" ||
  ! grep -q '^train-0 ' "$work/wb-local-status.log" ||
  ! grep -q '^infer-0 ' "$work/wb-local-status.log" ||
  ! grep -q "stopped 3 process(es)" "$work/wb-local.log" || [ -e "$root/tmp/wb-local-0" ]; then
  cat "$work/wb-local.log" "$work/wb-local-status.log" >&2
  fail "wb-local up / status / down"
fi
log "install check: wb-local up, status (both agents), down"

# 5. remove keeps the conffiles, purge leaves nothing of the package.
leftovers() {  # the package's files (not directories) still in the root, sorted
  local f
  while read -r f; do
    if [ -e "$root$f" ] && [ ! -d "$root$f" ]; then echo "$f"; fi
  done <"$work/files" | sort
}
in_root apt-get remove -y -q weightbeam >"$work/remove.log" 2>&1 || fail "apt-get remove"
left=$(leftovers | tr '\n' ' ')
[ "$left" = "/etc/weightbeam/agent.yaml /etc/weightbeam/controller.yaml " ] ||
  fail "after apt-get remove, left: '$left' (expected the two conffiles)"
in_root apt-get purge -y -q weightbeam >>"$work/remove.log" 2>&1 || fail "apt-get purge"
left=$(leftovers)
[ -z "$left" ] || fail "after apt-get purge, left: $left"
[ ! -e "$root/etc/weightbeam" ] || fail "after apt-get purge, /etc/weightbeam is still there"
in_root dpkg-query -W -f='${Status}\n' weightbeam 2>/dev/null | grep -q 'install ok installed' &&
  fail "dpkg still lists weightbeam after purge"
log "install check: apt-get remove kept the 2 conffiles; purge left no file of the package"
log "install check: PASS ($((SECONDS - start)) s)"
