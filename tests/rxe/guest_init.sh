#!/bin/busybox sh
# /init of the Soft-RoCE VM (tests/rxe/vm.sh): mount the host root read-only over 9p, chroot into
# it, run the job (which sets up Soft-RoCE first: tests/rxe/guest_setup.sh) and report its exit status on
# the second serial port (WB_VM_EXIT=N), then power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

OUT=/dev/ttyS1
finish() {
  printf '\nWB_VM_EXIT=%s\n' "$1" >"$OUT"
  sync
  poweroff -f
}

for arg in $(cat /proc/cmdline); do
  case "$arg" in
    wb_job=*) JOB=${arg#wb_job=} ;;
  esac
done

for m in $(cat /modules/order); do
  insmod "/modules/$m.ko" || { echo "insmod $m failed" >"$OUT"; finish 125; }
done
R=/mnt/root
H=/mnt/host
mkdir -p "$R" "$H"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 hostroot "$H" ||
  { echo "mounting the host root over 9p failed" >"$OUT"; finish 125; }
mount --bind "$H" "$R"
mount --bind /proc "$R/proc"
mount --bind /sys "$R/sys"
mkdir -p /dev/shm
mount --bind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/dev/shm"
mount -t tmpfs tmpfs "$R/tmp"
mount -t tmpfs tmpfs "$R/run"
# What those tmpfs hide that the job needs (a clone under /tmp, Bazel's output base under
# /tmp/...: vm.sh lists them in $JOB/binds, the job directory itself is inside the repository)
# is bound back from the host's view.
[ -f "$H$JOB/binds" ] || { echo "the job's $JOB/binds is not visible over 9p" >"$OUT"; finish 125; }
while IFS= read -r p; do
  [ -n "$p" ] || continue
  if [ ! -d "$H$p" ]; then
    echo "[vm] $p: not found on the host (over 9p), not mapped into the VM" >"$OUT"
    continue
  fi
  mkdir -p "$R$p" && mount --bind "$H$p" "$R$p" ||
    { echo "[vm] binding $p into the VM failed" >"$OUT"; finish 125; }
done <"$H$JOB/binds"

chroot "$R" /bin/sh "$JOB/cmd.sh" >"$OUT" 2>&1 </dev/null
finish $?
