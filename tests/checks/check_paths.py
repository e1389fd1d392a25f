#!/usr/bin/env python3
"""Every path the repository's files give to a reader resolves for that reader.

1. No absolute path into somebody's machine: a checkout or notes folder (/work/..., /home/...,
   /root/..., /Users/...). System paths (/dev/shm, /run/weightbeam, /usr/local/cuda, /etc, /mnt
   examples, ...) are fine: every machine has them, or they are examples of a user's choice.
2. Every relative Markdown link ([text](path)) names a file or folder of the repository.
3. Every repository path quoted in Markdown (`common/planner/README.md`, `tests/bench/x.cc`)
   exists, when it starts with one of the repository's top-level folders.

Run by ./wb test (tests/run_extra.sh); prints each offence as FILE:LINE: what, exits 1 if any.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|home|root|Users)/[\w.@+-]+(?:/[\w.@+-]*)*")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
QUOTED = re.compile(r"`([A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*[A-Za-z0-9_])`")
TEXT_SUFFIXES = (".md", ".cc", ".h", ".cu", ".py", ".sh", ".bzl", ".bazel", ".yaml", ".yml",
                 ".proto", ".json", ".service", ".txt", ".toml", ".cfg")
# Files that must mention such paths: this checker and its test of itself.
SELF = {"tests/checks/check_paths.py"}


def repo_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if os.path.isfile(os.path.join(ROOT, f))]


def check(files):
    top = {f.split("/", 1)[0] for f in files if "/" in f}
    problems = []
    for rel in files:
        if rel in SELF or not (rel.endswith(TEXT_SUFFIXES) or os.path.basename(rel) in ("wb", "run")):
            continue
        try:
            text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in MACHINE_PATH.finditer(line):
                problems.append(f"{rel}:{n}: absolute path on one machine: {m.group(0)}")
            if not rel.endswith(".md"):
                continue
            for m in MD_LINK.finditer(line):
                target = m.group(1).split("#", 1)[0]
                if not target or re.match(r"^[a-z]+:", target):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(os.path.join(ROOT, rel)), target))
                if not path.startswith(ROOT) or not os.path.exists(path):
                    problems.append(f"{rel}:{n}: link to a missing file: {m.group(1)}")
            for m in QUOTED.finditer(line):
                path = m.group(1)
                if path.split("/", 1)[0] not in top or any(c in path for c in "*<>{}"):
                    continue
                # A unit may be named without its extension (`common/gpu/cuda_ipc`).
                if not any(os.path.exists(os.path.join(ROOT, path + ext))
                           for ext in ("", ".h", ".cc", ".py", ".sh")):
                    problems.append(f"{rel}:{n}: names a missing repository path: {path}")
    return problems


def main():
    problems = check(repo_files())
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"paths: {len(problems)} path(s) a reader cannot follow", file=sys.stderr)
        return 1
    print("paths: every repository reference resolves; no machine-local absolute path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
