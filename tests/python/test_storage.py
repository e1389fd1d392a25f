"""The storage path from Python: two wb-agents that share only a directory (no controller, tcp
off). A trainer publishes versions with LocalSession.publish; an inference worker with another
sharding sees begin/commit and holds the trainer's bytes; a stale version is refused."""

import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import weightbeam
from cluster import free_port, wait_until


def start_agent(directory, name, storage):
    bin_dir = os.environ.get("WB_BIN_DIR", "bazel-bin")
    config = os.path.join(directory, name + ".yaml")
    with open(config, "w") as f:
        f.write(f"name: {name}\nlocal_socket: {directory}/{name}.sock\n"
                f"listen: 127.0.0.1:{free_port()}\ncontroller: 127.0.0.1:{free_port()}\n"
                f"transports:\n  tcp:\n    enabled: false\nstorage:\n{storage}")
    with open(os.path.join(directory, name + ".log"), "w") as log:  # the child keeps its own
        proc = subprocess.Popen([os.path.join(bin_dir, "daemon/wb-agent"), "--config", config],
                                stdout=log, stderr=subprocess.STDOUT)
    sock = f"{directory}/{name}.sock"
    wait_until(lambda: os.path.exists(sock), 15, f"{name} to serve {sock}")
    return proc, sock


class StorageTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="wb-pystore-", dir="/tmp")
        bucket = os.path.join(self.dir, "bucket")
        self.pub, pub_sock = start_agent(self.dir, "pub", f"  dir: {bucket}\n  role: publish\n")
        self.sub, sub_sock = start_agent(self.dir, "sub",
                                         f"  dir: {bucket}\n  role: subscribe\n  poll_ms: 20\n")
        self.src_buf = weightbeam.SharedBuffer(64 * 256 * 2, "pysrc")
        self.dst_buf = weightbeam.SharedBuffer(64 * 128 * 2, "pydst")
        self.src = self.src_buf.array(np.uint16, (64, 256), 0)
        self.dst = self.dst_buf.array(np.uint16, (64, 128), 0)
        self.trainer = weightbeam.LocalSession(pub_sock, "trainer", rank=0)
        self.trainer.register("w", "bf16", (64, 256), buffer=self.src)
        self.worker = weightbeam.LocalSession(sub_sock, "inference", rank=1)
        # Columns 128..255 of the tensor (the trainer holds it whole).
        self.worker.register("w", "bf16", (64, 256), shard=[(0, 64), (128, 128)], buffer=self.dst)
        self.worker.watch()

    def tearDown(self):
        self.trainer.close()
        self.worker.close()
        for p in (self.pub, self.sub):
            p.terminate()
            p.wait(10)
        self.src_buf.close()
        self.dst_buf.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_versions_arrive_through_the_directory(self):
        rng = np.random.default_rng(1)
        self.src[:] = rng.integers(0x3c00, 0x3fff, size=(64, 256), dtype=np.uint16)
        for version in range(1, 4):
            if version > 1:
                self.src[rng.integers(0, 64, 20), rng.integers(0, 256, 20)] += 1
            result = self.trainer.publish(version)
            self.assertEqual(result.anchor, version == 1)
            self.assertEqual(result.dense_bytes, 64 * 256 * 2)
            if version > 1:
                self.assertLess(result.bytes_written, result.dense_bytes // 4)
            begin = self.worker.next_event(20)
            commit = self.worker.next_event(20)
            self.assertEqual((begin.kind, begin.version), ("begin", version))
            self.assertEqual((commit.kind, commit.version), ("commit", version))
            np.testing.assert_array_equal(self.dst, self.src[:, 128:])
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.trainer.publish(3)
        self.assertIn("version 3 is not newer than the last published version 3",
                      str(caught.exception))


if __name__ == "__main__":
    unittest.main()
