"""Test support for controller high availability (issue 45): a real etcd (Debian's etcd-server,
one member or three), two wb-controllers with `ha:` in one election, and wb-agents that know
both controllers. Optionally the first controller runs in a network namespace of its own, joined
to this one by a veth pair, so a test can cut it off (from etcd and from everyone) and join it
back. Processes, files and namespaces are the test's own and go at stop()."""

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request

import weightbeam
from cluster import free_port, stop_processes, wait_until

ETCD = os.environ.get("WB_ETCD", "/usr/bin/etcd")


def have_etcd():
    return os.access(ETCD, os.X_OK)


def can_make_namespaces():
    return os.geteuid() == 0 and shutil.which("ip") is not None


def make_etcd_pki(d):
    """A throw-away CA and certificates for etcd and the controllers (SAN IP 127.0.0.1) in d."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca")
    for name in ("etcd", "wb-controller"):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName=DNS:{name},IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return d


def _b64(text):
    return base64.b64encode(text.encode()).decode()


class Etcd:
    """``members`` etcd members on loopback, each with its own data dir under ``root``. With
    ``pki`` (make_etcd_pki) they serve TLS and require client certificates."""

    def __init__(self, root, members=1, listen_host="127.0.0.1", pki=None):
        self.root = root
        self.pki = pki
        self.scheme = "https" if pki else "http"
        self.client_ports = [free_port() for _ in range(members)]
        peer_ports = [free_port() for _ in range(members)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peer_ports))
        self.procs = []
        tls = ([f"--cert-file={pki}/etcd.pem", f"--key-file={pki}/etcd.key",
                f"--trusted-ca-file={pki}/ca.pem", "--client-cert-auth"] if pki else [])
        for i in range(members):
            client = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}"
            listen = f"{self.scheme}://{listen_host}:{self.client_ports[i]}"
            peer = f"http://127.0.0.1:{peer_ports[i]}"
            with open(os.path.join(root, f"etcd-m{i}.log"), "ab") as log:
                self.procs.append(subprocess.Popen(
                    [ETCD, "--name", f"m{i}", "--data-dir", os.path.join(root, f"etcd-m{i}"),
                     "--listen-client-urls", listen, "--advertise-client-urls", client,
                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                     "--initial-cluster", cluster, "--initial-cluster-state", "new",
                     "--initial-cluster-token", "wb-ha-test", *tls],
                    stdout=log, stderr=subprocess.STDOUT))
        wait_until(lambda: self.get("/ready", quiet=True) is not False, 30, "etcd to answer")

    def endpoints(self, host="127.0.0.1"):
        return [f"{self.scheme}://{host}:{p}" for p in self.client_ports]

    def get(self, key, quiet=False):
        """The value at ``key`` (None: absent) from any member that answers; False: none did."""
        answer = self._post("/v3/kv/range", {"key": _b64(key)})
        if answer is None:
            if quiet:
                return False
            raise AssertionError("no etcd member answers")
        kvs = answer.get("kvs", [])
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def put(self, key, value):
        """Writes ``value`` at ``key`` behind the controllers' backs (a careless operator)."""
        if self._post("/v3/kv/put", {"key": _b64(key), "value": _b64(value)}) is None:
            raise AssertionError("no etcd member answers")

    def _post(self, path, request):
        """The gateway's JSON answer from the first live member that gives one, else None."""
        context = None
        if self.pki:
            context = ssl.create_default_context(cafile=f"{self.pki}/ca.pem")
            context.load_cert_chain(f"{self.pki}/wb-controller.pem", f"{self.pki}/wb-controller.key")
        body = json.dumps(request).encode()
        for i, url in enumerate(self.endpoints()):
            if self.procs[i].poll() is not None:
                continue
            try:
                with urllib.request.urlopen(url + path, body, timeout=2, context=context) as r:
                    return json.load(r)
            except OSError:
                continue
        return None

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def stop(self):
        stop_processes(self.procs)


class Namespace:
    """A network namespace joined to this one by a veth pair: ``host_ip`` here, ``ns_ip``
    inside. cut() takes the link down inside (nothing crosses; ``host_ip`` stays a local
    address here), join() brings it back."""

    def __init__(self):
        tag = f"{os.getpid() % 10000}{int(time.monotonic() * 1000) % 100}"
        self.name = f"wbha-{tag}"
        self.host_if, self.ns_if = f"wbh{tag}", f"wbn{tag}"
        octet = int(tag) % 250 + 1
        self.host_ip, self.ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
        run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
        run("ip", "netns", "add", self.name)
        self.made = True
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        run("ip", "link", "set", self.ns_if, "netns", self.name)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        inside = ("ip", "netns", "exec", self.name)
        run(*inside, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        run(*inside, "ip", "link", "set", self.ns_if, "up")
        run(*inside, "ip", "link", "set", "lo", "up")

    def prefix(self):
        return ["ip", "netns", "exec", self.name]

    def cut(self):
        subprocess.run(self.prefix() + ["ip", "link", "set", self.ns_if, "down"], check=True)

    def join(self):
        subprocess.run(self.prefix() + ["ip", "link", "set", self.ns_if, "up"], check=True)

    def remove(self):
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


class HaCluster:
    """etcd, controllers "a" and "b" (one election), and one agent per name in ``agents``.
    With ``namespace``, controller "a" runs in its own network namespace."""

    def __init__(self, agents, world, etcd_members=1, lease_ttl_ms=2000, namespace=False,
                 agent_yaml=None, etcd_tls=False):
        """``agent_yaml(name)`` (a function) is appended to each agent's file; ``etcd_tls``:
        etcd serves TLS with client certificates, the controllers use ha.etcd_tls."""
        self.bin_dir = os.environ.get("WB_BIN_DIR", "bazel-bin")
        self.dir = tempfile.mkdtemp(prefix="wb-ha-", dir="/tmp")
        self.lease_ttl_s = lease_ttl_ms / 1000
        self.ns = Namespace() if namespace else None
        self._procs = {}
        try:
            # In a namespace test etcd also answers on the veth (controller "a" reaches it
            # there); everything else talks on the host side's address.
            host = self.ns.host_ip if self.ns else "127.0.0.1"
            pki = make_etcd_pki(self.dir) if etcd_tls else None
            self.etcd = Etcd(self.dir, etcd_members, "0.0.0.0" if self.ns else "127.0.0.1", pki)
            tls_yaml = (f"  etcd_tls:\n    ca_file: {pki}/ca.pem\n    cert_file: "
                        f"{pki}/wb-controller.pem\n    key_file: {pki}/wb-controller.key\n"
                        if pki else "")
            self.addresses = {"a": f"{self.ns.ns_ip if self.ns else host}:{free_port()}",
                              "b": f"127.0.0.1:{free_port()}"}
            self.metrics = {n: f"{a.rsplit(':', 1)[0]}:{free_port()}"
                            for n, a in self.addresses.items()}
            for name in ("a", "b"):
                etcd = self.etcd.endpoints(self.ns.host_ip if self.ns and name == "a"
                                           else "127.0.0.1")
                self._write(f"controller-{name}.yaml", (
                    f"listen: {self.addresses[name]}\nlog_level: info\n"
                    f"metrics_listen: {self.metrics[name]}\n"
                    "heartbeat_timeout_ms: 3000\n"
                    f"world:\n  trainer_ranks: {world[0]}\n  inference_replicas: {world[1]}\n"
                    f"  inference_ranks_per_replica: {world[2]}\n"
                    f"ha:\n  etcd: [{', '.join(etcd)}]\n  election: test\n"
                    f"  lease_ttl_ms: {lease_ttl_ms}\n" + tls_yaml))
                self.start_controller(name)
                if name == "a":  # "a" leads first: the tests know who to kill
                    wait_until(lambda: self.state("a") == "leader", 20, "controller a to lead")
            self.sockets = {}
            controllers = ",".join(self.addresses.values())
            for name in agents:
                sock = self._path(f"{name}.sock")
                self.sockets[name] = sock
                self._write(f"{name}.yaml", (
                    f"name: {name}\nlog_level: warn\nlocal_socket: {sock}\n"
                    f"listen: {host}:{free_port()}\ncontroller: {controllers}\n"
                    "heartbeat_interval_ms: 200\ntransports:\n  tcp:\n    listen: 127.0.0.1:0\n"
                    "executor:\n  staging_watermark_bytes: 64MiB\n"
                    + (agent_yaml(name) if agent_yaml else "")))
                self._start(name, [os.path.join(self.bin_dir, "daemon/wb-agent"), "--config",
                                   self._path(f"{name}.yaml")])
            for name, sock in self.sockets.items():
                wait_until(lambda: os.path.exists(sock), 20, f"agent {name} (see {self.dir})")
        except BaseException:
            self.stop()
            raise

    def start_controller(self, name):
        prefix = self.ns.prefix() if self.ns and name == "a" else []
        self._start(f"controller-{name}", prefix + [
            os.path.join(self.bin_dir, "controller/wb-controller"), "--config",
            self._path(f"controller-{name}.yaml")])

    def client(self, *names):
        """A ControllerClient of the named controllers (default: both, a first)."""
        names = names or ("a", "b")
        return weightbeam.ControllerClient([self.addresses[n] for n in names], failover_s=30)

    def status(self, name):
        with weightbeam.ControllerClient(self.addresses[name]) as c:
            return c._unary("Status", weightbeam.controller_client.controller_pb2.StatusRequest(),
                            2, leader_only=False)

    def state(self, name):
        """"leader" / "taking over" / "standby", or None when it does not answer."""
        try:
            return self.status(name).leadership.state
        except weightbeam.WeightbeamError:
            return None

    def scrape(self, name):
        """The controller's /metrics as {series: value} (unlabelled series only)."""
        with urllib.request.urlopen(f"http://{self.metrics[name]}/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
        return {ln.split()[0]: float(ln.split()[1]) for ln in lines
                if ln and not ln.startswith("#") and "{" not in ln}

    def wbctl(self, *args):
        """wbctl with every controller, as an operator runs it; its stdout."""
        controllers = ",".join(self.addresses.values())
        out = subprocess.run([os.path.join(self.bin_dir, "client/wbctl"), "--controller",
                              controllers, *args], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise AssertionError(f"wbctl {' '.join(args)}: {out.stderr}")
        return out.stdout

    def ledger(self):
        text = self.etcd.get("/weightbeam/ledger/test")
        return json.loads(text) if text else None

    def signal(self, name, sig):
        self._procs[name].send_signal(sig)
        if sig == signal.SIGKILL:
            self._procs[name].wait()

    def log(self, name):
        with open(self._path(f"{name}.log"), errors="replace") as f:
            return f.read()

    def stop(self):
        stop_processes(self._procs.values())
        if getattr(self, "etcd", None):
            self.etcd.stop()
        if self.ns:
            self.ns.remove()
        if not os.environ.get("WB_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _write(self, name, text):
        with open(self._path(name), "w") as f:
            f.write(text)

    def _start(self, name, argv):
        with open(self._path(f"{name}.log"), "ab") as out:
            self._procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
