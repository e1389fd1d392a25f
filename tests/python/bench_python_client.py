"""Benchmark: the Python client's own costs against real daemons (two agents over tcp).
Registers TENSORS BF16 tensors from a trainer and a worker, plans, runs STEPS steps, and prints
one JSON line: per-tensor registration round trip, plan time, step seconds and GB/s as seen from
Python's ControllerClient.step()."""

import json
import statistics
import sys
import time

import numpy as np

import weightbeam
from cluster import Cluster

TENSORS = 256
SHAPE = (512, 512)  # 512 KiB of BF16 each: 128 MiB in all
STEPS = 5


def register_all(session, buffer):
    nbytes = SHAPE[0] * SHAPE[1] * 2
    start = time.perf_counter()
    for i in range(TENSORS):
        view = buffer.array(np.uint16, SHAPE, i * nbytes)
        session.register(f"layers.{i}.w", "bf16", SHAPE, buffer=view)
    return (time.perf_counter() - start) / TENSORS


def main():
    cluster = Cluster(["trainer-node", "inference-node"], trainer_ranks=1)
    total = TENSORS * SHAPE[0] * SHAPE[1] * 2
    try:
        src = weightbeam.SharedBuffer(total, "src")
        dst = weightbeam.SharedBuffer(total, "dst")
        src.array(np.uint8, (total,))[...] = np.random.default_rng(0).integers(0, 255, total,
                                                                               np.uint8)
        trainer = weightbeam.LocalSession(cluster.sockets["trainer-node"], "trainer")
        worker = weightbeam.LocalSession(cluster.sockets["inference-node"], "inference")
        reg_trainer = register_all(trainer, src)
        reg_worker = register_all(worker, dst)
        ctl = weightbeam.ControllerClient(cluster.controller_address)
        t = time.perf_counter()
        ctl.plan(1, 1, 1, wait_s=30)
        plan_s = time.perf_counter() - t
        seconds = []
        for v in range(1, STEPS + 1):
            t = time.perf_counter()
            ctl.step(v)
            seconds.append(time.perf_counter() - t)
        if not np.array_equal(src.array(np.uint8, (total,)), dst.array(np.uint8, (total,))):
            sys.exit("the destination does not hold the source bytes")
        median = statistics.median(seconds)
        print(json.dumps({
            "bench": "python_client", "tensors": TENSORS, "bytes": total,
            "register_ms_per_tensor_trainer": round(reg_trainer * 1e3, 3),
            "register_ms_per_tensor_worker": round(reg_worker * 1e3, 3),
            "plan_s": round(plan_s, 3), "step_s_median": round(median, 4),
            "step_gbps_median": round(total / median / 1e9, 3),
        }))
        trainer.close()
        worker.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
