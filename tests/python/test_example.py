"""client/python/examples/train_loop.py runs as documented: against a real agent and controller,
with an inference worker holding the same tensors, its steps commit."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import weightbeam
from cluster import Cluster

EXAMPLES = os.path.join(os.environ.get("WB_SRC_DIR", "."), "client/python/examples")
EXAMPLE = os.path.join(EXAMPLES, "train_loop.py")
WORKER = os.path.join(EXAMPLES, "inference_worker.py")
SHAPES = {"embed.weight": (1024, 256), "layers.0.mlp.weight": (512, 256), "norm.weight": (256,)}


class TrainLoopExampleTest(unittest.TestCase):

    def test_the_example_pushes_every_step(self):
        cluster = Cluster(["node"], trainer_ranks=1)
        try:
            buffer = weightbeam.SharedBuffer(sum(int(np.prod(s)) * 2 for s in SHAPES.values()))
            worker = weightbeam.LocalSession(cluster.sockets["node"], "inference")
            offset, arrays = 0, {}
            for name, shape in SHAPES.items():
                arrays[name] = buffer.array(np.uint16, shape, offset)
                worker.register(name, "bf16", shape, buffer=arrays[name])
                offset += arrays[name].nbytes
            worker.watch()
            run = subprocess.run(
                [sys.executable, EXAMPLE, "--socket", cluster.sockets["node"], "--controller",
                 cluster.controller_address, "--steps", "2"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("step 2: ", run.stdout)
            events = [worker.next_event(timeout=30) for _ in range(4)]
            kinds = [(e.kind, e.version) if e else None for e in events]
            self.assertEqual(kinds, [("begin", 1), ("commit", 1), ("begin", 2), ("commit", 2)])
            self.assertTrue(all(a.any() for a in arrays.values()), "the weights arrived")
            worker.close()
            buffer.close()
        finally:
            cluster.stop()

    def test_the_examples_with_capture_and_an_acknowledging_staged_worker(self):
        # The agent captures each step and stages what it receives; the worker acknowledges
        # each begin, and checks every commit against the checksum the trainer wrote.
        cluster = Cluster(["node"], trainer_ranks=1,
                          agent_yaml=lambda name: "capture:\n  max_bytes: 64MiB\n"
                                                  "receive:\n  mode: staged\n")
        checksums = tempfile.mkdtemp(prefix="wb-example-")
        try:
            worker = subprocess.Popen(
                [sys.executable, WORKER, "--socket", cluster.sockets["node"], "--ack",
                 "--commits", "3", "--timeout", "60", "--checksum-dir", checksums],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.assertIn("waiting for commits", worker.stdout.readline())
            run = subprocess.run(
                [sys.executable, EXAMPLE, "--socket", cluster.sockets["node"], "--controller",
                 cluster.controller_address, "--steps", "3", "--checksum-dir", checksums],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("step 3: ", run.stdout)
            self.assertIn("(trainer held", run.stdout)
            self.assertIn("captured)", run.stdout)  # not "in place": the agent captured
            out, _ = worker.communicate(timeout=60)
            self.assertEqual(worker.returncode, 0, out)
            self.assertEqual(out.count("checksum OK"), 3, out)
        finally:
            shutil.rmtree(checksums, ignore_errors=True)
            cluster.stop()


if __name__ == "__main__":
    unittest.main()
