"""The Python ControllerClient against a controller in mutual TLS + token mode (a test CA made
by openssl in a temp dir): with the CA, a client certificate and the token, plan and step commit
and the bytes land; without the token the call is refused (UNAUTHENTICATED, saying a token is
required); without TLS settings it cannot reach the controller; an unreadable token file is an
error naming the file."""

import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import weightbeam
from cluster import Cluster, wait_until

TOKEN = "py-test-token-93b1"


def make_pki():
    d = tempfile.mkdtemp(prefix="wb-pypki-", dir="/tmp")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=ca")
    for name in ("wb-controller", "trainer-node", "inference-node", "trainer"):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName=DNS:{name},IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    with open(os.path.join(d, "token"), "w") as f:
        f.write(TOKEN + "\n")
    return d


def tls_yaml(pki, name, agent):
    y = (f"tls:\n  enabled: true\n  cert_file: {pki}/{name}.pem\n  key_file: {pki}/{name}.key\n"
         f"  ca_file: {pki}/ca.pem\n  require_client_cert: true\n  token_file: {pki}/token\n")
    return y + ("  controller_identity: wb-controller\n" if agent else "")


class SecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = make_pki()
        cls.cluster = Cluster(["trainer-node", "inference-node"], trainer_ranks=1,
                              controller_yaml=tls_yaml(cls.pki, "wb-controller", False),
                              agent_yaml=lambda name: tls_yaml(cls.pki, name, True))

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.pki, ignore_errors=True)

    def client(self, **kw):
        return weightbeam.ControllerClient(self.cluster.controller_address, **kw)

    def test_plan_and_step_with_certificate_and_token(self):
        shape = (64, 128)
        src_buf = weightbeam.SharedBuffer(64 * 128 * 2, "src")
        dst_buf = weightbeam.SharedBuffer(64 * 128 * 2, "dst")
        src = src_buf.array(np.uint16, shape)
        dst = dst_buf.array(np.uint16, shape)
        src[:] = np.arange(64 * 128, dtype=np.uint16).reshape(shape)
        trainer = weightbeam.LocalSession(self.cluster.sockets["trainer-node"], "trainer")
        worker = weightbeam.LocalSession(self.cluster.sockets["inference-node"], "inference")
        trainer.register("w", "bf16", shape, buffer=src)
        worker.register("w", "bf16", shape, buffer=dst)
        p = self.pki
        with self.client(ca_file=f"{p}/ca.pem", cert_file=f"{p}/trainer.pem",
                         key_file=f"{p}/trainer.key", token_file=f"{p}/token") as ctl:
            ctl.plan(trainer_ranks=1, inference_replicas=1, inference_ranks_per_replica=1,
                     wait_s=20)
            ctl.step(1)
        self.assertTrue(np.array_equal(src, dst))
        trainer.close()
        worker.close()

    def test_without_token_the_controller_says_one_is_required(self):
        p = self.pki
        with self.client(ca_file=f"{p}/ca.pem", cert_file=f"{p}/trainer.pem",
                         key_file=f"{p}/trainer.key") as ctl:
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                ctl.status()
        self.assertEqual(e.exception.code, "UNAUTHENTICATED")
        self.assertIn("wb-controller requires a token", str(e.exception))

    def test_without_tls_the_controller_is_unreachable(self):
        with self.client(token_file=f"{self.pki}/token") as ctl:
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                ctl.status()
        self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_unreadable_token_file_names_it(self):
        with self.assertRaises(weightbeam.WeightbeamError) as e:
            self.client(token_file="/nonexistent/token")
        self.assertIn("token_file: cannot read /nonexistent/token", str(e.exception))


if __name__ == "__main__":
    unittest.main()
