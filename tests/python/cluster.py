"""Test support: a real wb-controller and wb-agents as subprocesses (as wb-demo starts them),
with YAML files, sockets and logs in a fresh temp dir. Binaries come from $WB_BIN_DIR (the
Bazel runfiles root under `bazel test`) or bazel-bin."""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time


_reserved = []  # abstract Unix sockets holding our ports against concurrent tests
_rng = random.SystemRandom()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A port on 127.0.0.1 for a daemon to listen on. Drawn below the kernel's ephemeral range
    (where outgoing connections take their ports), and reserved for this process's lifetime with
    an abstract Unix socket named after it, as tests/support/process.cc does."""
    high = max(11000, _ephemeral_low()) - 1
    for _ in range(1000):
        port = _rng.randint(10000, high)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        hold = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            hold.bind(f"\0wb-test-port-{port}")
        except OSError:
            hold.close()
            continue
        _reserved.append(hold)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def _accepts(host, port):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def wait_until(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"gave up after {timeout_s} s waiting for {what}")


def stop_processes(procs):
    """SIGTERM to each (SIGCONT first: a test may have frozen one), then SIGKILL to any still
    there after 5 s."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Cluster:
    """A controller expecting ``world`` and one agent per name in ``agents``."""

    def __init__(self, agents, trainer_ranks, inference_replicas=1, inference_ranks_per_replica=1,
                 controller_yaml="", agent_yaml=None):
        """``controller_yaml`` is appended to the controller's file, ``agent_yaml(name)`` (a
        function) to each agent's (e.g. a tls: block)."""
        bin_dir = os.environ.get("WB_BIN_DIR", "bazel-bin")
        self.dir = tempfile.mkdtemp(prefix="wb-py-", dir="/tmp")  # short: Unix socket paths
        self.controller_address = f"127.0.0.1:{free_port()}"
        self._procs = []
        self.sockets = {}
        self._write("controller.yaml", (
            f"listen: {self.controller_address}\nlog_level: warn\nheartbeat_timeout_ms: 3000\n"
            f"world:\n  trainer_ranks: {trainer_ranks}\n  inference_replicas: "
            f"{inference_replicas}\n  inference_ranks_per_replica: "
            f"{inference_ranks_per_replica}\n" + controller_yaml))
        self._start([os.path.join(bin_dir, "controller/wb-controller"), "--config",
                     self._path("controller.yaml")], "controller.log")
        # Agents started before the controller listens register only after a backoff.
        host, port = self.controller_address.rsplit(":", 1)
        wait_until(lambda: _accepts(host, int(port)), 20, f"the controller (see {self.dir})")
        for name in agents:
            sock = self._path(f"{name}.sock")
            self.sockets[name] = sock
            self._write(f"{name}.yaml", (
                f"name: {name}\nlog_level: warn\nlocal_socket: {sock}\n"
                f"listen: 127.0.0.1:{free_port()}\ncontroller: {self.controller_address}\n"
                "heartbeat_interval_ms: 200\ntransports:\n  tcp:\n    listen: 127.0.0.1:0\n"
                "executor:\n  staging_watermark_bytes: 64MiB\n"
                + (agent_yaml(name) if agent_yaml else "")))
            self._start([os.path.join(bin_dir, "daemon/wb-agent"), "--config",
                         self._path(f"{name}.yaml")], f"{name}.log")
        for name, sock in self.sockets.items():
            wait_until(lambda: os.path.exists(sock), 20, f"agent {name} (see {self.dir})")

    def log(self, name):
        with open(self._path(f"{name}.log")) as f:
            return f.read()

    def stop(self):
        stop_processes(reversed(self._procs))
        self._procs.clear()
        if not os.environ.get("WB_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _write(self, name, text):
        with open(self._path(name), "w") as f:
            f.write(text)

    def _start(self, argv, log):
        with open(self._path(log), "ab") as out:
            self._procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
