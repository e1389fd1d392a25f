#!/usr/bin/env bash
# ./wb package: the release artifacts, built offline from this checkout (docs/install.md).
#
#   dist/weightbeam_<version>_<arch>.deb    wb-agent, wb-controller, wbctl, systemd units,
#                                            example configs (conffiles), a `weightbeam` group
#   dist/weightbeam-<version>-py3-none-any.whl, dist/weightbeam-<version>.tar.gz
#                                            the Python client with its generated stubs
#
# The version is the VERSION file's; the binaries are stamped with the git commit
# (tools/workspace_status.sh, common/version). Options:
#   --check     afterwards, the install test (deploy/install_check.sh): the .deb into a fresh
#               Debian bookworm root, the daemons from the installed paths, the wheel in a venv
#   --out DIR   where the artifacts go (default: dist/ in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT="$ROOT/dist"
CHECK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --check) CHECK=1 ;;
    --out)
      OUT=$(realpath -m "$2")
      shift
      ;;
    *)
      echo "usage: ./wb package [--check] [--out DIR]" >&2
      exit 2
      ;;
  esac
  shift
done

log() { printf '\033[1m[wb]\033[0m %s\n' "$*" >&2; }

VERSION=$(tr -d ' \n' <VERSION)
ARCH=$(dpkg --print-architecture)
COMMIT=$(tools/workspace_status.sh | sed -n 's/^STABLE_WB_GIT_COMMIT //p')
STAGE="$ROOT/.cache/package"
DEB="weightbeam_${VERSION}_${ARCH}.deb"
TARGETS=(//daemon:wb-agent //controller:wb-controller //client:wbctl //client/python:stubs)

# 1. The binaries, stamped: only these targets see the commit (common/version:build_info reads
# it from Bazel's stable-status.txt); `./wb build` passes no status command and keeps its cache.
mkdir -p "$ROOT/.cache/logs" "$OUT"
start=$SECONDS
log "package: building ${TARGETS[*]} at $COMMIT (Bazel's output: .cache/logs/package.log)"
if ! bazel build --jobs=2 --color=no --curses=no \
  --workspace_status_command="$ROOT/tools/workspace_status.sh" "${TARGETS[@]}" \
  >"$ROOT/.cache/logs/package.log" 2>&1; then
  grep -E '^ERROR|error:' "$ROOT/.cache/logs/package.log" | head -n 20 >&2 || true
  log "package: build FAILED (.cache/logs/package.log)"
  exit 1
fi
log "package: built in $((SECONDS - start)) s"
for b in daemon/wb-agent controller/wb-controller; do
  line=$("bazel-bin/$b" --version)
  case "$line" in
    *" $VERSION (commit $COMMIT)") ;;
    *) log "package: $b --version says '$line', expected $VERSION and $COMMIT" && exit 1 ;;
  esac
done

# CUDA: the agent is the CUDA build when the build found nvcc (tools/cuda_configure.bzl, same
# rule); the CUDA runtime is linked statically, so either way the package needs only the driver.
if [ -x "${WB_CUDA_ROOT:-/usr/local/cuda}/bin/nvcc" ] && [ "${WB_DISABLE_CUDA:-}" != 1 ]; then
  CUDA_NOTE="wb-agent is the CUDA build (GPU memory through CUDA IPC; needs the NVIDIA driver
 only where GPU memory is registered)."
else
  CUDA_NOTE="wb-agent is the host-memory build (no CUDA toolkit on the build machine)."
fi

# 2. The .deb's tree.
rm -rf "$STAGE"
deb="$STAGE/deb"
install -d "$deb/DEBIAN" "$deb/usr/bin" "$deb/lib/systemd/system" "$deb/etc/weightbeam" \
  "$deb/usr/share/doc/weightbeam/examples/python" "$deb/usr/share/bash-completion/completions"
for b in daemon/wb-agent controller/wb-controller client/wbctl; do
  install -m 0755 "bazel-bin/$b" "$deb/usr/bin/"
  strip --strip-unneeded "$deb/usr/bin/$(basename "$b")"
done
install -m 0755 deploy/wb-local.sh "$deb/usr/bin/wb-local"
install -m 0644 deploy/systemd/wb-agent.service deploy/systemd/wb-controller.service \
  "$deb/lib/systemd/system/"
# Conffiles: dpkg keeps the admin's edits on upgrade and removes them on purge.
install -m 0644 deploy/etc/controller.yaml "$deb/etc/weightbeam/controller.yaml"
install -m 0644 deploy/etc/agent-train-0.yaml "$deb/etc/weightbeam/agent.yaml"
install -m 0644 deploy/etc/*.yaml "$deb/usr/share/doc/weightbeam/examples/"
install -m 0644 client/python/examples/*.py "$deb/usr/share/doc/weightbeam/examples/python/"
install -m 0644 README.md docs/install.md "$deb/usr/share/doc/weightbeam/"
bazel-bin/client/wbctl completion bash >"$deb/usr/share/bash-completion/completions/wbctl"
chmod 0644 "$deb/usr/share/bash-completion/completions/wbctl"
# Man pages from the programs' own --help (help2man), so they say what the parsers accept;
# wbctl's adds each subcommand's --help and the exit codes of docs/cli.md.
man="$deb/usr/share/man/man1"
install -d "$man"
# On PATH, so that argv[0] (in the usage lines) is the bare program name.
binpath="$ROOT/bazel-bin/client:$ROOT/bazel-bin/daemon:$ROOT/bazel-bin/controller:$PATH"
h2m="$STAGE/wbctl.h2m"
{
  echo "[SUBCOMMANDS]"
  for sub in $(PATH=$binpath wbctl --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF {print $1}'); do
    printf '.SS %s\n.nf\n' "$sub"
    PATH=$binpath wbctl "$sub" --help | sed 's/\\/\\\\/g; s/^\./\\\&./'
    printf '.fi\n'
  done
  echo "[EXIT STATUS]"
  sed -n 's/^| \([0-9][0-9]*\) | \(.*\) |$/.TP\n\1\n\2/p' docs/cli.md | tr -d '`'
  printf '[SEE ALSO]\nwb-agent(1), wb-controller(1); /usr/share/doc/weightbeam/install.md\n'
} >"$h2m"
PATH=$binpath help2man --no-info --no-discard-stderr --version-string="$VERSION" \
  --include="$h2m" --name="inspect and drive a weightbeam cluster" wbctl >"$man/wbctl.1"
PATH=$binpath help2man --no-info --no-discard-stderr --version-string="$VERSION" \
  --name="the weightbeam agent: moves model weights between training and inference GPUs" \
  wb-agent >"$man/wb-agent.1"
PATH=$binpath help2man --no-info --no-discard-stderr --version-string="$VERSION" \
  --name="the weightbeam controller: plans and coordinates weight transfers" \
  wb-controller >"$man/wb-controller.1"
gzip -9n "$man"/*.1
chmod 0644 "$man"/*.gz

cat >"$deb/usr/share/doc/weightbeam/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: weightbeam
Comment: built from commit $COMMIT of the weightbeam repository.

Files: *
Copyright: the weightbeam authors
License: see the weightbeam source repository
EOF
printf 'weightbeam (%s) unstable; urgency=medium\n\n  * Built by ./wb package from commit %s.\n\n -- weightbeam developers <weightbeam@localhost>  %s\n' \
  "$VERSION" "$COMMIT" "$(git log -1 --format=%aD 2>/dev/null || date -R)" |
  gzip -9n >"$deb/usr/share/doc/weightbeam/changelog.Debian.gz"
printf '/etc/weightbeam/agent.yaml\n/etc/weightbeam/controller.yaml\n' >"$deb/DEBIAN/conffiles"
install -m 0755 deploy/debian/postinst deploy/debian/prerm deploy/debian/postrm "$deb/DEBIAN/"

# Depends: the Debian packages of the shared libraries the binaries link, found by
# dpkg-shlibdeps (from the installed packages' shlibs/symbols files), not listed by hand.
shl="$STAGE/shlibdeps"
mkdir -p "$shl/debian"
printf 'Source: weightbeam\n\nPackage: weightbeam\nArchitecture: any\n' >"$shl/debian/control"
shlibs=$(cd "$shl" && dpkg-shlibdeps -O -e"$deb/usr/bin/wb-agent" -e"$deb/usr/bin/wb-controller" \
  -e"$deb/usr/bin/wbctl" 2>"$shl/warnings" | sed -n 's/^shlibs:Depends=//p')
if [ -z "$shlibs" ]; then
  cat "$shl/warnings" >&2
  log "package: dpkg-shlibdeps found no dependencies"
  exit 1
fi
cat >"$deb/DEBIAN/control" <<EOF
Package: weightbeam
Version: $VERSION
Architecture: $ARCH
Maintainer: weightbeam developers <weightbeam@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$deb" | cut -f1)
Depends: adduser, $shlibs
Recommends: ibverbs-providers
Suggests: python3-grpcio, python3-protobuf, python3-numpy
Section: net
Priority: optional
Description: move model weights from RL trainer GPUs into inference GPUs
 weightbeam copies a training job's weights into inference engines' GPU memory after
 every optimizer step, over RDMA or TCP, planned by a controller.
 .
 This package holds wb-agent (one per GPU node), wb-controller, the wbctl command line,
 wb-local (a controller and two agents on one machine), their systemd units (not enabled:
 edit /etc/weightbeam/*.yaml first) and example configurations. Built from commit
 $COMMIT; $CUDA_NOTE
EOF
rm -f "$OUT"/weightbeam_*_"$ARCH".deb
dpkg-deb --root-owner-group -Zxz --build "$deb" "$OUT/$DEB" >/dev/null
log "package: $OUT/$DEB ($(du -h "$OUT/$DEB" | cut -f1)); Depends: adduser, $shlibs"
log "package: ${CUDA_NOTE//$'\n '/ }"

# 3. The Python client: sources, generated stubs and the version in one folder, built with
# Debian's python3-build / setuptools / wheel and no network (--no-isolation).
py="$STAGE/python"
deploy/stage_python.sh "$py"
printf '__version__ = "%s"\n__commit__ = "%s"\n' "$VERSION" "$COMMIT" >"$py/weightbeam/_version.py"
printf 'include VERSION\n' >"$py/MANIFEST.in"
rm -f "$OUT"/weightbeam-*.whl "$OUT"/weightbeam-*.tar.gz
if ! (cd "$py" && /usr/bin/python3 -m build --no-isolation --outdir "$OUT" . \
  >"$ROOT/.cache/logs/package-python.log" 2>&1); then
  tail -n 20 "$ROOT/.cache/logs/package-python.log" >&2
  log "package: the Python build FAILED (.cache/logs/package-python.log)"
  exit 1
fi
for f in "$OUT"/weightbeam-"$VERSION"-py3-none-any.whl "$OUT"/weightbeam-"$VERSION".tar.gz; do
  [ -f "$f" ] || { log "package: $f missing" && exit 1; }
  log "package: $f ($(du -h "$f" | cut -f1))"
done
rm -rf "$STAGE"

log "package: container image: podman build -f deploy/container/Containerfile -t IMAGE $OUT"
if [ "$CHECK" = 1 ]; then
  exec deploy/install_check.sh "$OUT"
fi
