"""Real torch 2.x DTensor trainers through real daemons: for each case a wb-controller and two
wb-agents (tests/python/cluster.py: "trainer-node", "inference-node") and WORLD ranks of
tests/trainers/trainer.py on gloo, started here as torchrun would (RANK, WORLD_SIZE,
MASTER_PORT). Prints one "[wb] trainers <case> (<seconds> s): PASS|FAIL" line per case, then
what was verified and refused; exits 1 on any failure. This process does not import torch.

    suite.py [--cases fsdp2,hsdp,fsdp+tp] [--timeout 240]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from cluster import Cluster, free_port  # noqa: E402

CASES = {"fsdp2": 3, "hsdp": 4, "fsdp+tp": 4}  # name: world (trainer.py's CASES)


def run_case(case, world, work, timeout_s):
    cluster = Cluster(["inference-node", "trainer-node"], trainer_ranks=world)
    out = os.path.join(work, f"{case}.json")
    port = free_port()
    procs, logs = [], []
    try:
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            log = os.path.join(work, f"{case}-rank{rank}.log")
            logs.append(log)
            with open(log, "wb") as f:
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "trainer.py"), "--case", case,
                     "--trainer-socket", cluster.sockets["trainer-node"],
                     "--inference-socket", cluster.sockets["inference-node"],
                     "--controller", cluster.controller_address, "--out", out],
                    stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append("timeout")
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        result = None
        if os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
        return codes, result, logs
    finally:
        cluster.stop()


def problems_of(codes, result, logs):
    problems = []
    if any(c != 0 for c in codes):
        problems.append(f"rank exit codes {codes}")
    if result is None:
        problems.append("rank 0 wrote no result")
        return problems
    problems += result["problems"]
    checked = [(v["version"], v["dtype"]) for v in result["versions"]]
    if checked != [(1, "bf16"), (1, "fp8"), (2, "bf16"), (2, "fp8")]:
        problems.append(f"versions checked: {checked}")
    for r in result.get("refusals", []):
        if not r["ok"]:
            problems.append(f"{r['what']}: not refused as expected ({r['error']})")
    return problems


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per case")
    args = ap.parse_args()
    failed = False
    verified, refused = [], []
    with tempfile.TemporaryDirectory(prefix="wb-trainers-") as work:
        for case in args.cases.split(","):
            start = time.monotonic()
            codes, result, logs = run_case(case, CASES[case], work, args.timeout)
            problems = problems_of(codes, result, logs)
            seconds = time.monotonic() - start
            if result:
                print(f"[trainers] {case}: torch {result['torch']}, world {result['world']}, "
                      f"mesh {result['mesh']}, parts per rank {result['parts_per_rank']}, "
                      f"placements {result['placements']}", flush=True)
                for v in result["versions"]:
                    print(f"[trainers] {case}: version {v['version']} -> vLLM tp {result['tp']} "
                          f"{v['dtype']}: step {v['step_s']:.2f} s, "
                          f"{v['params']} engine parameters checked"
                          + (f", {v['changed']} changed by the optimizer step"
                             if v["changed"] is not None else ""), flush=True)
                    if not v["problems"]:
                        verified.append(f"{case} (world {result['world']}, mesh "
                                        f"{result['mesh']}) -> vLLM tp {result['tp']} "
                                        f"{v['dtype']}, version {v['version']}")
                for r in result.get("refusals", []):
                    refused.append(f"{case}: {r['what']}: {r['error']}")
            for p in problems:
                print(f"[trainers] {case}: {p}", flush=True)
            if problems:
                failed = True
                for log in logs:
                    print(f"--- {os.path.basename(log)}\n{tail(log)}", flush=True)
            print(f"[wb] trainers {case} ({seconds:.0f} s): {'FAIL' if problems else 'PASS'}",
                  flush=True)
    print("[trainers] verified (bit for bit against full_tensor() laid out by "
          "engine_reference):")
    for row in verified:
        print("  " + row)
    print("[trainers] refused:")
    for row in refused:
        print("  " + row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
