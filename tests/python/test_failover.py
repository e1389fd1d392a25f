"""Controller failover through etcd (issue 45), with real processes: a real etcd, two
wb-controllers in one election ("a" leads first), a trainer agent and an inference agent that
know both controllers, and a training loop's ControllerClient given both addresses. The leader
is SIGKILLed between steps and mid-step, frozen (SIGSTOP) past its lease, and cut off from etcd
and everyone (its network namespace); the etcd cluster loses one of three members. Each time a
standby leads within 2 x the lease TTL, the loop's next step(v) commits on it with every byte
compared against the trainer's own, no version is committed twice or lost (the worker's commit
events, the ledger in etcd and the agents agree), and a deposed leader that comes back is
refused by the agents (by epoch) and stands by."""

import signal
import threading
import time
import unittest

import grpc
import numpy as np

import weightbeam
from cluster import wait_until
from ha_cluster import HaCluster, can_make_namespaces, have_etcd

TENSORS = {f"layers.{i}.w": (512, 2048) for i in range(8)}  # 16 MiB of BF16
LEASE_TTL_MS = 2000
# The trainer's agent captures each version before sending it, and the test hook holds every
# capture this long (as tens of GB would take): a fault 0.3 s into a step lands inside it.
CAPTURE = "capture:\n  max_bytes: 64MiB\n  test_delay_ms: 700\n"
INSIDE_A_STEP_S = 0.3


def logged_at(log, text):
    """The time (seconds since the epoch) of the first log line holding ``text``."""
    import datetime
    for line in log.splitlines():
        if text in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
            return stamp.timestamp()
    raise AssertionError(f"no log line with {text!r}")


class Sides:
    """One trainer rank and one inference rank (BF16 both), each on its own agent."""

    def __init__(self, cluster, watch=None):
        self.trainer = weightbeam.LocalSession(cluster.sockets["trainer-node"], "trainer", 0)
        self.worker = weightbeam.LocalSession(cluster.sockets["inference-node"], "inference", 0,
                                              replica=0)
        nbytes = sum(r * c * 2 for r, c in TENSORS.values())
        self.tbuf = weightbeam.SharedBuffer(nbytes, "ha-trainer")
        self.wbuf = weightbeam.SharedBuffer(nbytes, "ha-worker")
        self.src, self.dst = {}, {}
        offset = 0
        for name, shape in TENSORS.items():
            self.src[name] = self.tbuf.array(np.uint16, shape, offset)
            self.dst[name] = self.wbuf.array(np.uint16, shape, offset)
            self.trainer.register(name, "bf16", shape, buffer=self.src[name])
            self.worker.register(name, "bf16", shape, buffer=self.dst[name])
            offset += shape[0] * shape[1] * 2
        self.heard = []
        self.rng = np.random.default_rng(45)
        if watch is None:
            self.worker.watch()
        else:
            watch(self)

    def train(self):
        for a in self.src.values():
            a[...] = self.rng.integers(0, 0x7F7F, a.shape, dtype=np.uint16)

    def assert_verified(self, case):
        for name in TENSORS:
            np.testing.assert_array_equal(self.dst[name], self.src[name], f"{case}: {name}")

    def commits(self):
        """Every commit version the worker heard so far, in order."""
        while not getattr(self, "pump", None):
            e = self.worker.next_event(timeout=0.2)
            if e is None:
                break
            self.heard.append(e)
        return [e.version for e in self.heard if e.kind == "commit"]

    def close(self):
        for c in (self.trainer, self.worker, self.tbuf, self.wbuf):
            c.close()


class Fleet(unittest.TestCase):
    """The fleet every case starts from (two steps committed on "a"), and what cases share."""
    ETCD_MEMBERS = 1
    LEASE_TTL_MS = LEASE_TTL_MS
    NAMESPACE = False
    ETCD_TLS = False
    AGENT_YAML = {"trainer-node": CAPTURE}
    WATCH = None

    def setUp(self):
        self.cluster = HaCluster(["inference-node", "trainer-node"], (1, 1, 1),
                                 etcd_members=self.ETCD_MEMBERS, lease_ttl_ms=self.LEASE_TTL_MS,
                                 namespace=self.NAMESPACE, etcd_tls=self.ETCD_TLS,
                                 agent_yaml=lambda n: self.AGENT_YAML.get(n, ""))
        self.sides = Sides(self.cluster, self.WATCH)
        self.ctl = self.cluster.client()
        self.ctl.plan(1, 1, 1, wait_s=30)
        for v in (1, 2):
            self.step(v)

    def tearDown(self):
        self.ctl.close()
        self.sides.close()
        self.cluster.stop()

    def step(self, v, timeout_s=30):
        self.sides.train()
        result = self.ctl.step(v, timeout_s=timeout_s)
        self.assertTrue(result.ok, result.error)
        self.sides.assert_verified(f"step {v}")
        return result

    def await_new_leader(self, since, old="a", new="b"):
        wait_until(lambda: self.cluster.state(new) == "leader", 4 * self.cluster.lease_ttl_s + 10,
                   f"controller {new} to lead")
        took = time.monotonic() - since
        print(f"\n[failover] {self.id().split('.')[-1]}: {new} seen leading {took:.2f} s after "
              f"the fault (lease TTL {self.cluster.lease_ttl_s:.1f} s)")
        self.assertLess(took, 2 * self.cluster.lease_ttl_s, "a standby leads within 2 x the TTL")
        return took

    def assert_agree(self, last):
        """The ledger, the new leader and the worker agree on what was committed."""
        wait_until(lambda: (self.cluster.ledger() or {}).get("lastCommittedVersion") == str(last),
                   10, f"the ledger to record version {last}")
        ledger = self.cluster.ledger()
        self.assertEqual([r.get("version") for r in ledger["replicas"]], [str(last)])
        status = self.cluster.status("b")
        self.assertEqual(status.last_committed_version, last)
        self.assertEqual([r.committed_version for r in status.replicas], [last])
        commits = self.sides.commits()
        self.assertEqual(commits, sorted(set(commits)), "no version committed twice")
        self.assertEqual(commits, list(range(1, last + 1)), "no version lost")

    def step_in_background(self, v):
        self.sides.train()
        outcome = {}

        def run():
            try:
                outcome["result"] = self.ctl.step(v, timeout_s=30)
            except weightbeam.WeightbeamError as e:
                outcome["error"] = e

        t = threading.Thread(target=run)
        t.start()
        return t, outcome

    def fault_during(self, t, outcome, sig):
        """Signals controller "a" while step `t` runs; once "b" leads and the step returned, its
        result (the client retried it there)."""
        fault = time.monotonic()
        self.cluster.signal("controller-a", sig)
        self.await_new_leader(fault)
        t.join(60)
        self.assertNotIn("error", outcome, outcome.get("error"))
        self.assertTrue(outcome["result"].ok)
        return outcome["result"]

    def kill_between_steps(self):
        killed = time.monotonic()
        self.cluster.signal("controller-a", signal.SIGKILL)
        # The C++ client (wbctl) given both controllers follows the election by itself: its
        # step goes to "a", finds it gone, and retries on "b" until "b" leads.
        self.sides.train()
        printed = self.cluster.wbctl("step", "3")
        print(f"[failover] wbctl step 3 committed {time.monotonic() - killed:.2f} s after the "
              "kill")
        self.assertIn("step 3", printed)
        self.sides.assert_verified("step 3 through wbctl")
        self.await_new_leader(killed)
        self.step(4)
        self.assertEqual(self.ctl.leader, self.cluster.addresses["b"])
        self.step(5)
        self.assert_agree(5)
        self.assertIn("the same as the last leader's", self.cluster.log("controller-b"))


@unittest.skipUnless(have_etcd(), "etcd is missing (Debian's etcd-server; ./wb deps installs it)")
class Failover(Fleet):
    def test_leader_killed_between_steps(self):
        self.kill_between_steps()

    def test_leader_killed_mid_step(self):
        t, outcome = self.step_in_background(3)
        time.sleep(INSIDE_A_STEP_S)
        # The step reached no replica: the new leader aborted it everywhere, and the client's
        # retry of the same version committed it there, once.
        result = self.fault_during(t, outcome, signal.SIGKILL)
        self.assertFalse(result.already_committed)
        self.assertIn("step 3 reached no replica: aborted everywhere",
                      self.cluster.log("controller-b"))
        self.sides.assert_verified("step 3 across the failover")
        self.step(4)
        self.assert_agree(4)

    def test_leader_frozen_mid_step_past_its_lease_is_refused_when_it_wakes(self):
        old_epoch = self.cluster.status("a").leadership.epoch
        agents = {a.info.name: a.info.control_endpoint for a in self.cluster.status("a").agents}
        t, outcome = self.step_in_background(3)
        time.sleep(INSIDE_A_STEP_S)
        self.fault_during(t, outcome, signal.SIGSTOP)
        self.sides.assert_verified("step 3 across the failover")
        new_epoch = self.cluster.status("b").leadership.epoch
        self.assertGreater(new_epoch, old_epoch)
        # Every agent now follows the new epoch and refuses the old one, naming both.
        for name, endpoint in agents.items():
            with grpc.insecure_channel(endpoint) as channel:
                describe = channel.unary_unary("/weightbeam.v1.Agent/Describe",
                                               request_serializer=lambda b: b,
                                               response_deserializer=lambda b: b)
                with self.assertRaises(grpc.RpcError) as refused:
                    describe(b"", metadata=(("wb-leader-epoch", str(old_epoch)),), timeout=5)
            self.assertEqual(refused.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn(f"from leader epoch {old_epoch} refused", refused.exception.details())
            self.assertIn(f"newer leader epoch {new_epoch}", refused.exception.details())
        # The old leader wakes up deposed: it stands by, names the new leader, drives nothing.
        self.cluster.signal("controller-a", signal.SIGCONT)
        wait_until(lambda: self.cluster.state("a") == "standby", 10, "a to stand by")
        with self.assertRaises(weightbeam.WeightbeamError) as e:
            with self.cluster.client("a") as only_a:
                only_a.step(4, timeout_s=5)
        self.assertEqual(e.exception.code, "UNAVAILABLE")
        self.assertIn("is a standby; the leader is " + self.cluster.addresses["b"],
                      e.exception.message)
        self.step(4)
        self.assert_agree(4)
        log_a = self.cluster.log("controller-a")
        self.assertIn("steps down", log_a)
        # Its own step 3, frozen inside the capture, failed on waking without driving anyone.
        wait_until(lambda: "step 3 failed" in self.cluster.log("controller-a"), 10,
                   "the old leader's step 3 to fail")
        status = self.cluster.status("b").leadership
        self.assertEqual((status.state, status.leader), ("leader", self.cluster.addresses["b"]))
        self.assertEqual(list(status.standbys), [self.cluster.addresses["a"]])
        # A client given both controllers, the standby first, reports the leader's status.
        with self.cluster.client("a", "b") as fresh:
            self.assertEqual(fresh.status().leadership.self, self.cluster.addresses["b"])
            self.assertEqual(fresh.leader, self.cluster.addresses["b"])
        # What an operator sees: wbctl given both controllers asks the leader; the metrics.
        printed = self.cluster.wbctl("status")
        self.assertIn(f"this controller ({self.cluster.addresses['b']}) is leader", printed)
        self.assertIn(f"(epoch {new_epoch}); standbys {self.cluster.addresses['a']}", printed)
        self.assertEqual(self.cluster.scrape("b")["weightbeam_controller_leader"], 1)
        self.assertEqual(self.cluster.scrape("a")["weightbeam_controller_leader"], 0)
        self.assertEqual(self.cluster.scrape("a")["weightbeam_controller_leader_epoch"], new_epoch)

    def test_step_captured_follows_a_leader_killed_before_the_capture(self):
        # The training loop of docs/clients.md: step_captured, then the result later.
        self.sides.train()
        started = {}

        def loop():
            try:
                handle = self.ctl.step_captured(3, timeout_s=30)
                started["captured"] = time.monotonic()
                started["result"] = handle.result(60)
            except weightbeam.WeightbeamError as e:
                started["error"] = e

        t = threading.Thread(target=loop)
        t.start()
        time.sleep(INSIDE_A_STEP_S)  # inside the capture (the test hook holds it 0.7 s)
        killed = time.monotonic()
        self.cluster.signal("controller-a", signal.SIGKILL)
        t.join(60)
        self.assertNotIn("error", started, started.get("error"))
        self.assertTrue(started["result"].ok)
        self.assertGreater(started["captured"], killed, "captured on the new leader, after")
        self.sides.assert_verified("step 3 captured across the failover")
        self.step(4)
        self.assert_agree(4)

    def test_a_ledger_that_does_not_parse_is_survived(self):
        # Someone wrote over the ledger by hand: the new leader says so, goes on without it
        # (no saved plan: its first step plans), and the next step commits and rewrites it.
        self.cluster.etcd.put("/weightbeam/ledger/test", "{not json")
        killed = time.monotonic()
        self.cluster.signal("controller-a", signal.SIGKILL)
        self.await_new_leader(killed)
        self.assertIn("does not parse: going on without it", self.cluster.log("controller-b"))
        self.step(3)
        self.assert_agree(3)

    def test_a_retried_step_is_answered_already_committed(self):
        # What the client sends when it retries after losing an answer (StepRequest.retry).
        retry = weightbeam.controller_client.controller_pb2.StepRequest(version=2, retry=True)
        again = self.ctl._unary("Step", retry, 10).result
        self.assertTrue(again.ok and again.already_committed)
        self.assertEqual(list(again.committed_replicas), [0])
        self.assertEqual(self.sides.commits(), [1, 2])
        # A step of an older version, or the same one without the retry mark, is refused.
        for request in ({"version": 1, "retry": True}, {"version": 2}):
            pb = weightbeam.controller_client.controller_pb2.StepRequest(**request)
            refused = self.ctl._unary("Step", pb, 10).result
            self.assertFalse(refused.ok)
            self.assertIn("is not newer than the last committed", refused.error)
        self.assertEqual(self.sides.commits(), [1, 2])


ACK_DELAY_S = 1.5


def watch_and_ack_late(sides):
    """The worker watches with acks (receive.mode staged) and acknowledges each begin(v) only
    ACK_DELAY_S later: the receiver's commit waits that long for it, the leader meanwhile."""
    sides.worker.watch(ack=True)
    sides.begun = {}
    sides.pump = True

    def pump():
        while True:
            try:
                e = sides.worker.next_event()
            except weightbeam.WeightbeamError:
                return
            sides.heard.append(e)
            if e.kind == "begin":
                sides.begun.setdefault(e.version, threading.Event()).set()
                time.sleep(ACK_DELAY_S)
                try:
                    sides.worker.ack(e.version)
                except weightbeam.WeightbeamError:
                    return

    threading.Thread(target=pump, daemon=True).start()


@unittest.skipUnless(have_etcd(), "etcd is missing")
class CommitReached(Fleet):
    """The leader dies after its commit reached the receiver (which waits for its watcher's
    late ack): the receiver commits anyway, the new leader finds the version there and counts
    it committed, and the client's retry is answered "already committed"."""
    AGENT_YAML = {"inference-node": "receive:\n  mode: staged\n  ack_timeout_ms: 5000\n"}
    WATCH = staticmethod(watch_and_ack_late)

    def test_leader_killed_after_its_commit_was_sent(self):
        t, outcome = self.step_in_background(3)
        wait_until(lambda: 3 in self.sides.begun, 20, "begin(3) on the worker")
        time.sleep(ACK_DELAY_S / 3)  # the commit is waiting for the ack
        self.assertTrue(self.fault_during(t, outcome, signal.SIGKILL).already_committed)
        self.assertIn("step 3 committed on 1 replica(s) by the old leader's commit",
                      self.cluster.log("controller-b"))
        self.sides.assert_verified("step 3, committed by the old leader's commit")
        self.step(4)
        self.assert_agree(4)



@unittest.skipUnless(have_etcd(), "etcd is missing")
class EtcdOverTls(Fleet):
    """etcd serving TLS and requiring client certificates (ha.etcd_tls): the same failover."""
    ETCD_TLS = True

    def test_leader_killed_between_steps(self):
        self.kill_between_steps()


@unittest.skipUnless(have_etcd(), "etcd is missing")
class ThreeEtcdMembers(Fleet):
    """The same fleet on a three-member etcd cluster: one member lost changes nothing. With the
    default lease (5 s): losing etcd's raft leader stalls writes for its election (~1 s), which a
    2 s lease does not always outlast (the leader then steps down, as it must)."""
    ETCD_MEMBERS = 3
    LEASE_TTL_MS = 5000

    def test_leader_killed_between_steps(self):
        self.kill_between_steps()

    def test_losing_one_etcd_member_changes_nothing(self):
        self.cluster.etcd.kill(0)
        for v in (3, 4, 5):
            self.step(v)
        self.assertEqual(self.cluster.state("a"), "leader")
        self.assert_agree_on_a(5)
        # The election still works with two of three: a failover after the loss.
        self.cluster.signal("controller-a", signal.SIGKILL)
        self.await_new_leader(time.monotonic())
        self.step(6)
        self.assert_agree(6)

    def assert_agree_on_a(self, last):
        wait_until(lambda: (self.cluster.ledger() or {}).get("lastCommittedVersion") == str(last),
                   10, f"the ledger to record version {last}")
        self.assertEqual(self.sides.commits(), list(range(1, last + 1)))



@unittest.skipUnless(have_etcd() and can_make_namespaces(), "needs etcd, root and ip netns")
class CutOff(Fleet):
    """Controller "a" in a network namespace of its own, then cut off (from etcd, the agents
    and the client): it steps down before its lease can expire, "b" leads, and once joined
    back "a" stands by and drives nothing."""
    NAMESPACE = True

    def test_leader_cut_off_from_etcd(self):
        cut = time.monotonic()
        self.cluster.ns.cut()
        self.await_new_leader(cut)
        self.step(3)
        self.cluster.ns.join()
        wait_until(lambda: self.cluster.state("a") == "standby", 15, "a to stand by")
        self.step(4)
        self.assert_agree(4)
        # No split brain: the cut-off leader stopped leading before the standby began to.
        stepped_down = logged_at(self.cluster.log("controller-a"), "steps down")
        took_over = logged_at(self.cluster.log("controller-b"), " leads, epoch")
        print(f"[failover] cut-off leader stepped down {took_over - stepped_down:.2f} s before "
              "the standby led")
        self.assertLess(stepped_down, took_over)



class NoEtcd(unittest.TestCase):
    """A controller whose etcd does not answer exits 2 naming it, before it serves anything."""

    def test_unreachable_etcd_is_a_clear_start_failure(self):
        import os
        import subprocess
        import tempfile
        from cluster import free_port
        bin_dir = os.environ.get("WB_BIN_DIR", "bazel-bin")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
            f.write(f"listen: 127.0.0.1:{free_port()}\nha:\n  etcd: [{url}]\n  election: x\n")
            f.flush()
            out = subprocess.run([os.path.join(bin_dir, "controller/wb-controller"), "--config",
                                  f.name], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertIn(f"ha: etcd ({url}) does not answer", out.stdout + out.stderr)


if __name__ == "__main__":
    unittest.main()
