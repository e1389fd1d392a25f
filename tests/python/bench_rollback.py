"""Benchmark: instant rollback (issue 43) against one local memcpy of the same bytes. One staged
inference agent keeping 2 versions holds TENSORS BF16 tensors (1 GiB by default, about the demo
model's 1.2 GB); versions 1 and 2 are pushed, then ctl.rollback(1) and ctl.rollback(2) are
timed (the controller's figure: every agent's copies) and compared with numpy copying the same
bytes once, on this machine, in this run. One JSON line; the goal is a ratio under 2.

    bazel run -c opt //tests/python:bench_rollback [-- --mib 1024 --rounds 3]"""

import argparse
import json
import os
import statistics
import time

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (4096, 8192)  # 64 MiB of BF16 each


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tensor_bytes = SHAPE[0] * SHAPE[1] * 2
    count = max(1, args.mib * (1 << 20) // tensor_bytes)
    total = count * tensor_bytes
    yaml = "receive:\n  mode: staged\n  keep_versions: 2\n"
    cluster = Cluster(["train", "infer"], trainer_ranks=1,
                      agent_yaml=lambda name: yaml if name == "infer" else "")
    closing = []
    try:
        trainer = weightbeam.LocalSession(cluster.sockets["train"], "trainer", rank=0)
        worker = weightbeam.LocalSession(cluster.sockets["infer"], "inference", rank=0,
                                         replica=0)
        tbuf = weightbeam.SharedBuffer(total, "trainer")
        wbuf = weightbeam.SharedBuffer(total, "worker")
        closing += [trainer, worker, tbuf, wbuf]
        sources = [tbuf.array(np.uint16, SHAPE, i * tensor_bytes) for i in range(count)]
        for i in range(count):
            trainer.register(f"t{i}", "bf16", SHAPE, buffer=sources[i])
            worker.register(f"t{i}", "bf16", SHAPE,
                            buffer=wbuf.array(np.uint16, SHAPE, i * tensor_bytes))
        ctl = weightbeam.ControllerClient(cluster.controller_address)
        closing.append(ctl)
        ctl.plan(1, 1, 1, wait_s=60)
        for v in (1, 2):
            for a in sources:
                a.fill(v)
            ctl.step(v)
        rollback = []
        for r in range(args.rounds):
            rollback.append(ctl.rollback(1).seconds)
            rollback.append(ctl.rollback(2).seconds)
        src = np.frombuffer(tbuf.memoryview(0, total), dtype=np.uint8)
        dst = np.frombuffer(wbuf.memoryview(0, total), dtype=np.uint8)
        memcpy = []
        for r in range(args.rounds):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            memcpy.append(time.perf_counter() - t0)
        best_rollback, best_memcpy = min(rollback), min(memcpy)
        print(json.dumps({
            "bench": "rollback", "bytes": total, "tensors": count,
            "rollback_seconds_min": round(best_rollback, 4),
            "rollback_seconds_median": round(statistics.median(rollback), 4),
            "memcpy_seconds_min": round(best_memcpy, 4),
            "ratio": round(best_rollback / best_memcpy, 2),
            "cores": os.cpu_count(), "loadavg": list(os.getloadavg())}))
    finally:
        for c in reversed(closing):
            c.close()
        cluster.stop()


if __name__ == "__main__":
    main()
