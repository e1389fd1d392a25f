#!/usr/bin/env python3
"""deploy/ agrees with what `./wb package` ships (deploy/package.sh):

1. deploy/kubernetes/weightbeam.yaml (and weightbeam-ha.yaml) runs the image deploy/container/Containerfile makes: every
   `image:` is <registry>/weightbeam:<VERSION>, and every `command:` starts with a binary the
   .deb installs (/usr/bin/wb-agent, /usr/bin/wb-controller).
2. The systemd units start the .deb's binaries (ExecStart=/usr/bin/...) with the .deb's
   conffiles (/etc/weightbeam/agent.yaml, /etc/weightbeam/controller.yaml).
3. The Containerfile installs weightbeam_*_amd64.deb on Debian bookworm, with the same other
   packages as the install test (deploy/install_check.sh's IMAGE_PACKAGES), which therefore
   resolves the image's package set on the same Debian release.

Run by ./wb test (tests/run_extra.sh); prints each offence, exits 1 if any.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BINARIES = {"/usr/bin/wb-agent", "/usr/bin/wb-controller", "/usr/bin/wbctl"}
CONFFILES = {"/etc/weightbeam/agent.yaml", "/etc/weightbeam/controller.yaml"}


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def main():
    errors = []
    version = read("VERSION").strip()
    # The plain manifest and the one with two controllers in high availability (issue 45).
    for manifest in ("deploy/kubernetes/weightbeam.yaml", "deploy/kubernetes/weightbeam-ha.yaml"):
        k8s = read(manifest)
        images = re.findall(r"^\s*image:\s*(\S+)", k8s, re.M)
        if not images:
            errors.append(f"{manifest}: no image")
        for image in images:
            if not re.fullmatch(r"[\w.:-]+(/[\w.-]+)*/weightbeam:" + re.escape(version), image):
                errors.append(f"{manifest}: image {image}: expected "
                              f"<registry>/weightbeam:{version} (VERSION)")
        for command in re.findall(r'^\s*command:\s*\["([^"]+)"', k8s, re.M):
            if command not in BINARIES:
                errors.append(f"{manifest}: command {command} is not one the "
                              f".deb installs ({', '.join(sorted(BINARIES))})")
    for unit in ("wb-agent", "wb-controller"):
        text = read(f"deploy/systemd/{unit}.service")
        m = re.search(r"^ExecStart=(\S+) --config (\S+)", text, re.M)
        if not m or m.group(1) != f"/usr/bin/{unit}" or m.group(2) not in CONFFILES:
            errors.append(f"deploy/systemd/{unit}.service: ExecStart should run /usr/bin/{unit} "
                          f"with one of {sorted(CONFFILES)}")
    container = read("deploy/container/Containerfile")
    if not re.search(r"^FROM \S*debian:bookworm", container, re.M):
        errors.append("deploy/container/Containerfile: not FROM debian:bookworm")
    if "apt-get install" not in container or "weightbeam_*_amd64.deb" not in container:
        errors.append("deploy/container/Containerfile: does not apt-get install the .deb")
    joined = container.replace("\\\n", " ")  # continuation lines joined
    m = re.search(r"apt-get install ([^&\n]*)", joined)
    words = m.group(1).split() if m else []
    image = {w for w in words if not w.startswith("-") and not w.endswith(".deb")}
    m = re.search(r"^IMAGE_PACKAGES=\(([^)]*)\)", read("deploy/install_check.sh"), re.M)
    tested = set(m.group(1).split()) if m else set()
    if image != tested:
        errors.append(f"deploy/container/Containerfile installs {sorted(image)} next to the .deb, "
                      f"deploy/install_check.sh's IMAGE_PACKAGES says {sorted(tested)}")
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"deploy: the Kubernetes example runs weightbeam:{version} from the Containerfile; "
              "units and manifests start the .deb's binaries")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
