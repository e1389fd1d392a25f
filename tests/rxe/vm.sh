#!/usr/bin/env bash
# Soft-RoCE VM harness: tests/rxe/vm.sh [--] CMD [ARGS...]
#
# Boots Debian's 6.1 kernel under QEMU (TCG), shares the host's root file system read-only over
# 9p, creates two Soft-RoCE devices (rxe0 on veth0 10.77.0.1, rxe1 on veth1 10.78.0.1), runs CMD
# as root in the repository, prints its output and exits with its status. Binaries built on the
# host (bazel-bin) run unchanged inside.
#
# Environment: WB_VM_TIMEOUT (seconds, default 900), WB_VM_MEM (default 3G), WB_VM_CPUS
# (default: host cores, at most 4), WB_VM_VERBOSE=1 (also print the kernel console).
# Variables named WB_* and CI are passed into the VM.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE="$ROOT/.cache/rxe"
TIMEOUT=${WB_VM_TIMEOUT:-900}
MEM=${WB_VM_MEM:-3G}
CPUS=${WB_VM_CPUS:-$(nproc)}
[ "$CPUS" -gt 4 ] && CPUS=4

log() { printf '[vm] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 125
}

[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || die "usage: tests/rxe/vm.sh [--] CMD [ARGS...]"

for tool in qemu-system-x86_64 apt-cache apt-get dpkg depmod; do
  command -v "$tool" >/dev/null || die "'$tool' not found (./wb deps installs qemu-system-x86, kmod)"
done
[ -x /bin/busybox ] || die "/bin/busybox not found (install busybox-static)"

# --- kernel: Debian's linux-image-amd64 (6.1), extracted once into the cache -------------------
kernel_package() {
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$pkg" ]; then
    # A fresh machine may have no package lists yet.
    log "apt-cache knows no linux-image-amd64: running apt-get update"
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
      awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  [ -n "$pkg" ] || die "apt-cache knows no linux-image-amd64 (run apt-get update)"
  echo "$pkg"
}

mkdir -p "$CACHE"
# Several runs at once (CI, two engineers) must not build the cache twice at the same time.
exec 9>"$CACHE/.lock"
flock 9
KDIR=$(ls -d "$CACHE"/kernel-linux-image-* 2>/dev/null | head -n1 || true)
if [ -z "$KDIR" ] || [ ! -f "$KDIR/.done" ]; then
  PKG=$(kernel_package)
  KDIR="$CACHE/kernel-$PKG"
  log "fetching $PKG into $KDIR (once)"
  rm -rf "$KDIR" "$CACHE/dl"
  mkdir -p "$CACHE/dl" "$KDIR"
  (cd "$CACHE/dl" && apt-get download -q "$PKG" >/dev/null 2>&1) ||
    { apt-get update -qq >/dev/null 2>&1 || true
      (cd "$CACHE/dl" && apt-get download -q "$PKG" >/dev/null 2>&1); } ||
    die "apt-get download $PKG failed"
  dpkg -x "$CACHE"/dl/"$PKG"_*.deb "$KDIR"
  KVER=$(ls "$KDIR/lib/modules")
  depmod -b "$KDIR" "$KVER"
  rm -rf "$CACHE/dl"
  touch "$KDIR/.done"
fi
KVER=$(ls "$KDIR/lib/modules")
VMLINUZ="$KDIR/boot/vmlinuz-$KVER"
MODDIR="$KDIR/lib/modules/$KVER"

# --- initramfs: static busybox + the modules that mount the host root over 9p -----------------
BOOT_MODULES=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs
  fscache 9pnet 9pnet_virtio 9p)
INITRD="$CACHE/initramfs-$KVER.cpio.gz"
INIT_SRC="$ROOT/tests/rxe/guest_init.sh"
if [ ! -f "$INITRD" ] || [ "$INIT_SRC" -nt "$INITRD" ] || [ "$0" -nt "$INITRD" ]; then
  STAGE=$(mktemp -d "$CACHE/initramfs.XXXXXX")
  mkdir -p "$STAGE"/{bin,dev,proc,sys,mnt/root,modules}
  cp /bin/busybox "$STAGE/bin/busybox"
  for m in "${BOOT_MODULES[@]}"; do
    ko=$(find "$MODDIR/kernel" -name "$m.ko" -print -quit)
    [ -n "$ko" ] || die "module $m not in $KDIR"
    cp "$ko" "$STAGE/modules/"
  done
  printf '%s\n' "${BOOT_MODULES[@]}" >"$STAGE/modules/order"
  cp "$INIT_SRC" "$STAGE/init"
  chmod +x "$STAGE/init"
  (cd "$STAGE" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  rm -rf "$STAGE"
fi

flock -u 9

# --- the job: a script on the host file system, which the guest sees through 9p -----------------
mkdir -p "$CACHE/jobs"
JOB=$(mktemp -d "$CACHE/jobs/job.XXXXXX")
cleanup() {
  [ -n "${QEMU_PID:-}" ] && kill "$QEMU_PID" 2>/dev/null || true
  [ -n "${TAIL_PID:-}" ] && kill "$TAIL_PID" 2>/dev/null || true
  rm -rf "$JOB"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The guest sees this machine's root read-only over 9p, but mounts fresh tmpfs on /tmp and /run.
# What it needs from under those (a clone in /tmp; Bazel's output base when the output root is
# there, e.g. --output_user_root=/tmp/x, which every bazel-* link and runfiles tree point into)
# is listed in $JOB/binds, and guest_init.sh bind-mounts each from the host view back in place.
guest_paths() {
  echo "$ROOT"
  local link target
  for link in "$ROOT"/bazel-*; do
    [ -L "$link" ] || continue
    target=$(readlink -f "$link") && [ -d "$target" ] || continue
    # bazel-out, bazel-bin, ...: all inside <output base>/execroot/<workspace>/.
    case "$target" in */execroot/*) echo "${target%%/execroot/*}" ;; *) echo "$target" ;; esac
  done
}
listed() {
  local q
  while IFS= read -r q; do
    case "$1/" in "$q"/*) return 0 ;; esac
  done <"$JOB/binds"
  return 1
}
: >"$JOB/binds"
while IFS= read -r p; do
  case "$p" in /tmp/* | /run/*) ;; *) continue ;; esac
  # Shortest first: a path inside one already listed comes with it.
  listed "$p" || echo "$p" >>"$JOB/binds"
done < <(guest_paths | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2- | uniq)
[ -s "$JOB/binds" ] && log "mapping into the guest (under its fresh /tmp, /run): $(paste -sd' ' "$JOB/binds")"

{
  echo "#!/bin/sh"
  echo "export HOME=/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  echo "export WB_IN_VM=1 WB_VM_MODDIR=$(printf '%q' "$KDIR")"
  while IFS='=' read -r name _; do
    case "$name" in WB_* | CI) echo "export $name=$(printf '%q' "${!name}")" ;; esac
  done < <(env)
  echo "cd $(printf '%q' "$ROOT") || exit 125"
  # A bazel-* link whose target the guest cannot see: say so before the command fails on it.
  cat <<'CHECK'
for l in bazel-*; do
  [ -L "$l" ] && [ ! -e "$l" ] && echo "[vm] $l -> $(readlink "$l"): not visible inside the VM" \
    "(the guest sees the host root read-only with fresh /tmp and /run; tests/rxe/vm.sh maps" \
    "the repository and Bazel's output base back in: is the output base elsewhere, or gone?)"
done
CHECK
  echo "tests/rxe/guest_setup.sh || { echo 'Soft-RoCE setup failed'; exit 125; }"
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$JOB/cmd.sh"
chmod +x "$JOB/cmd.sh"
: >"$JOB/out.log"
: >"$JOB/console.log"

log "booting $KVER (TCG, $CPUS cpus, $MEM); timeout ${TIMEOUT}s"
timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp "$CPUS" -m "$MEM" \
  -kernel "$VMLINUZ" -initrd "$INITRD" \
  -append "console=ttyS0 loglevel=4 panic=-1 wb_job=$JOB" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -display none -monitor none -nic none -no-reboot \
  -serial "file:$JOB/console.log" -serial "file:$JOB/out.log" </dev/null &
QEMU_PID=$!

# Stream the command's output (second serial port) while the VM runs, without the marker line.
tail -n +1 -f "$JOB/out.log" --pid="$QEMU_PID" 2>/dev/null | grep --line-buffered -v '^WB_VM_EXIT=' &
TAIL_PID=$!
set +e
wait "$QEMU_PID"
QEMU_RC=$?
set -e
QEMU_PID=
wait "$TAIL_PID" 2>/dev/null || true
TAIL_PID=

if [ "${WB_VM_VERBOSE:-0}" = "1" ]; then
  log "kernel console:"
  cat "$JOB/console.log" >&2
fi
RC=$(tr -d '\r' <"$JOB/out.log" | sed -n 's/^WB_VM_EXIT=\([0-9]*\)$/\1/p' | tail -n1)
if [ -z "$RC" ]; then
  if [ "$QEMU_RC" -eq 124 ] || [ "$QEMU_RC" -eq 137 ]; then
    log "timed out after ${TIMEOUT}s"
  else
    log "the VM ended without an exit status (qemu status $QEMU_RC)"
  fi
  log "last kernel console lines:"
  tail -n 30 "$JOB/console.log" >&2
  exit 125
fi
exit "$RC"
