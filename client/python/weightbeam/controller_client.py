"""The training loop's handle on the controller: plan once, then ``step(version)`` after every
optimizer step; plus the status queries. Mirrors the C++ ``wb::client::ControllerClient``."""

import os
import re
import threading
import time

import grpc

from weightbeam import _stubs
from weightbeam.errors import StepFailed, StepTimeout, WeightbeamError, from_rpc_error

controller_pb2 = _stubs.controller_pb2
controller_pb2_grpc = _stubs.controller_pb2_grpc


def _read(path, what, binary=True):
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()
    except OSError as e:
        raise WeightbeamError(f"{what}: cannot read {path}: {e.strerror}", "INVALID_ARGUMENT")


# Keepalive pings find a controller that stopped answering (frozen, or its host gone) in a few
# seconds, so a call to it fails over instead of waiting out its deadline (wb-controller
# accepts pings this often).
_KEEPALIVE = [("grpc.keepalive_time_ms", 2000), ("grpc.keepalive_timeout_ms", 2000),
              ("grpc.http2.max_pings_without_data", 0)]
_LEADER_HINT = re.compile(r"\[wb-leader: ([^\]]*)\]")


def _addresses(address):
    """``"a:7100"``, ``"a:7100,b:7100"`` or a list of them -> the list."""
    parts = address.split(",") if isinstance(address, str) else list(address)
    out = [p.strip() for p in parts if p and p.strip()]
    if not out:
        raise WeightbeamError(f"no controller address in {address!r}", "INVALID_ARGUMENT")
    return out


class ControllerClient:
    """``ControllerClient("host:port")``; nothing is sent until the first call.

    With controllers in high availability (``ha:``, docs/reliability.md) give every one:
    ``ControllerClient("a:7100,b:7100")`` (or a list). Calls go to the leader; a standby's
    answer (UNAVAILABLE, naming the leader) or a controller that stopped answering moves the
    call on to the next, retried until ``failover_s`` (a step: its ``timeout_s`` when set).
    A retried ``step(v)`` of a version the old leader had committed is answered "already
    committed" (``result.already_committed``): a version is never committed twice.

    For a controller with TLS: ``ca_file`` (verifies its certificate), ``cert_file`` and
    ``key_file`` (ours, for mutual TLS), ``server_name`` (the name its certificate carries, when
    not the host); ``token_file`` holds the shared call token. Each defaults to the environment:
    WB_TLS_CA, WB_TLS_CERT, WB_TLS_KEY, WB_TLS_SERVER_NAME, WB_TOKEN_FILE (as wbctl)."""

    def __init__(self, address, ca_file=None, cert_file=None, key_file=None, token_file=None,
                 server_name=None, failover_s=60.0):
        self._addresses = _addresses(address)
        self._address = ",".join(self._addresses)
        self._failover_s = failover_s
        env = os.environ.get
        ca_file = ca_file or env("WB_TLS_CA")
        cert_file = cert_file or env("WB_TLS_CERT")
        key_file = key_file or env("WB_TLS_KEY")
        token_file = token_file or env("WB_TOKEN_FILE")
        server_name = server_name or env("WB_TLS_SERVER_NAME")
        if bool(cert_file) != bool(key_file):
            raise WeightbeamError("a client certificate needs both cert_file and key_file",
                                  "INVALID_ARGUMENT")
        self._metadata = None
        if token_file:
            token = _read(token_file, "token_file", binary=False).strip()
            if not token:
                raise WeightbeamError(f"token_file: {token_file} is empty", "INVALID_ARGUMENT")
            self._metadata = (("authorization", "Bearer " + token),)
        options = [("grpc.max_receive_message_length", 256 << 20)]
        if len(self._addresses) > 1:
            options += _KEEPALIVE
        self._credentials = None
        if ca_file or cert_file:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_file, "ca_file") if ca_file else None,
                private_key=_read(key_file, "key_file") if key_file else None,
                certificate_chain=_read(cert_file, "cert_file") if cert_file else None)
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
        self._options = options
        self._channels = {}  # address -> (channel, stub), made on first use
        self._lock = threading.Lock()
        self._current = 0  # index of the controller that answered last
        self._channel, self._stub = self._connect(self._addresses[0])

    def _connect(self, address):
        with self._lock:
            if address not in self._channels:
                if self._credentials is not None:
                    channel = grpc.secure_channel(address, self._credentials,
                                                  options=self._options)
                else:
                    channel = grpc.insecure_channel(address, options=self._options)
                self._channels[address] = (channel, controller_pb2_grpc.ControllerStub(channel))
            return self._channels[address]

    @property
    def leader(self):
        """The controller address calls go to now (the one that answered last)."""
        return self._addresses[self._current]

    def plan(self, trainer_ranks=0, inference_replicas=0, inference_ranks_per_replica=0,
             wait_s=30.0, delta=None, check_finite=False, digest=False, frozen=(),
             user_check=False, user_check_deadline_s=10.0):
        """Waits (up to ``wait_s``) for the world to be complete, plans, loads the plan on the
        senders; returns the PlanSummary. All zeros: the world from the controller's config.
        ``delta``: True / False turns delta mode on / off for this plan (and the plans made
        after a layout change); None keeps the controller's configuration.
        ``check_finite``: every receiver checks each version's bytes for NaN / Inf before it
        commits; a version that fails is aborted everywhere and ``step`` raises StepFailed
        naming the tensor (staged receivers keep serving the previous version).
        ``user_check``: every receiving agent (receive.mode staged) hands each version's staged
        bytes to the check watchers of the inference processes (LocalSession.check_versions)
        and waits up to ``user_check_deadline_s`` for their verdicts; a refusal, a missed
        deadline or a user with no check watcher aborts the version on every replica and
        ``step`` raises StepFailed naming the watcher and its reason.
        ``digest``: every committed replica reports a digest of the version it holds
        (StepResult.replica_digests / digest, status().replicas[k].digest).
        ``frozen``: trainer tensor patterns ('*' wildcards) sent by the plan's first step only
        (and by any step a replica needs whole), never again (dense plans without relays)."""
        world = controller_pb2.ExpectedWorld(
            trainer_ranks=trainer_ranks, inference_replicas=inference_replicas,
            inference_ranks_per_replica=inference_ranks_per_replica)
        choice = {None: controller_pb2.DELTA_CHOICE_CONFIG, True: controller_pb2.DELTA_CHOICE_ON,
                  False: controller_pb2.DELTA_CHOICE_OFF}[delta]
        request = controller_pb2.PlanRequest(world=world, wait_ms=int(wait_s * 1000),
                                             delta=choice)
        request.checks.finite = bool(check_finite)
        request.checks.digest = bool(digest)
        if user_check:
            request.checks.user = True
            request.checks.user_deadline_ms = max(1, int(user_check_deadline_s * 1000))
        request.frozen.extend(frozen)
        return self._unary("Plan", request, wait_s + 60).summary

    def step(self, version, timeout_s=0, max_staleness=None, ready=(), changed=()):
        """Pushes ``version`` to the inference side and returns the StepResult once committed.
        ``ready``: this process's trainer LocalSessions; their sources_ready() runs first, so
        that no agent reads weights the optimizer is still writing (other ranks call their own
        before the barrier that precedes this call).
        A failed step raises StepFailed with the controller's message (agent and cause) and the
        result. ``timeout_s`` 0 uses the controller's configured step timeout. With
        ``max_staleness`` the step first waits (within its timeout) until no inference replica
        left out of it would be more than that many versions behind (docs/elastic.md).
        ``changed``: a partial step: only the trainer tensors matching these patterns ('*'
        wildcards) changed since the last version, and only their ops run (dense plans
        without relays); a replica that needs every tensor makes the step run whole."""
        for session in ready:
            session.sources_ready()
        request = controller_pb2.StepRequest(version=int(version),
                                             timeout_ms=int(timeout_s * 1000),
                                             changed=list(changed))
        if max_staleness is not None:
            request.max_staleness = int(max_staleness)
        # Each attempt is bounded by the step's timeout (the controller's own enforces it);
        # failing over may retry it on the new leader until the same deadline.
        attempt = timeout_s + 30 if timeout_s else None
        result = self._unary("Step", request, attempt,
                             failover_s=timeout_s or self._failover_s).result
        if not result.ok:
            raise StepFailed(result.error or f"step {version} failed", result)
        return result

    def rollback(self, to, replicas=()):
        """Makes every inference replica (or those in ``replicas``) live at kept version ``to``
        again, with one local copy on each of its agents (staged receivers with
        ``receive.keep_versions``); nothing crosses the network. Returns the StepResult
        (``rollback`` set); raises StepFailed naming the agent and the versions it keeps when
        one of them does not keep ``to`` (then nothing changed)."""
        request = controller_pb2.RollbackRequest(to=int(to), replicas=[int(k) for k in replicas])
        result = self._unary("Rollback", request, 300).result
        if not result.ok:
            raise StepFailed(result.error or f"rollback to {to} failed", result)
        return result

    def step_async(self, version, timeout_s=0, max_staleness=None):
        """Starts step ``version`` and returns its StepHandle at once (Controller.StepAsync).
        ``handle.wait_captured(timeout)`` returns once every sender has captured the version:
        from then on the trainer may change its weights (changing them before is the caller's
        bug: the step may send some of the new bytes). ``handle.result(timeout)`` returns the
        StepResult, or raises StepFailed as step() does. On a plan without capture
        (capture.max_bytes 0 on a sender) the senders read in place and wait_captured returns
        only with the result. Arguments as for step()."""
        request = controller_pb2.StepRequest(version=int(version),
                                             timeout_ms=int(timeout_s * 1000))
        if max_staleness is not None:
            request.max_staleness = int(max_staleness)
        # As step(): the controller enforces the step's timeout; this guards against one that
        # stalls.
        backstop = timeout_s + 60 if timeout_s else 15 * 60
        if len(self._addresses) > 1:
            self._find_leader(timeout_s or self._failover_s)
        deadline = time.monotonic() + (timeout_s or self._failover_s)

        def start(retry):
            """Opens the call on the leader: (call, address). With several controllers the
            handle calls it again, retry set, when the leader goes before the capture."""
            request.retry = retry
            address = self.leader
            _, stub = self._connect(address)
            return stub.StepAsync(request, timeout=backstop, metadata=self._metadata), address

        try:
            call, address = start(False)
        except grpc.RpcError as e:
            raise from_rpc_error(e, f"StepAsync on controller {self._address}") from None
        failover = None
        if len(self._addresses) > 1:
            def failover(error):
                if time.monotonic() >= deadline:
                    return None
                self._next(error.message)
                time.sleep(0.2)
                return start(True)
        return StepHandle(int(version), call, address, failover)

    def step_captured(self, version, timeout_s=0, max_staleness=None, capture_timeout_s=None):
        """The training loop's one call: starts step ``version``, waits until every sender has
        captured it, and returns the StepHandle (its result() comes later). The weights may
        change as soon as this returns. ``capture_timeout_s`` (default: the step's timeout, or
        15 minutes) bounds the wait for the capture."""
        handle = self.step_async(version, timeout_s=timeout_s, max_staleness=max_staleness)
        wait = capture_timeout_s
        if wait is None:
            wait = timeout_s + 60 if timeout_s else 15 * 60
        handle.wait_captured(wait)
        return handle

    def status(self):
        """The controller's StatusResponse: agents, plan, last committed version, recent steps.
        With several controllers: the leader's (``leadership`` names it), else, when none
        leads within a few seconds, the first answer (a standby's, naming the leader it knows)."""
        request = controller_pb2.StatusRequest()
        if len(self._addresses) > 1:
            try:
                return self._unary("Status", request, 5, failover_s=3, leader_only=True)
            except WeightbeamError:
                pass
        return self._unary("Status", request, 30, leader_only=False)

    def list_tensors(self, agent=""):
        """Every agent's (or one agent's) registered tensors: a list of AgentLayout."""
        request = controller_pb2.ListTensorsRequest(agent=agent)
        return list(self._unary("ListTensors", request, 30, leader_only=False).layouts)

    def watch_steps(self):
        """Iterates over StepResults as the controller finishes steps (cancel by closing)."""
        try:
            stub = self._connect(self.leader)[1]
            yield from stub.WatchSteps(controller_pb2.WatchStepsRequest(), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, f"WatchSteps on {self._address}") from None

    def close(self):
        with self._lock:
            for channel, _ in self._channels.values():
                channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _find_leader(self, within_s):
        """Points calls at the controller that leads now (Status says so), waiting up to
        ``within_s`` for one (a standby takes over within about 2 lease TTLs)."""
        self._unary("Status", controller_pb2.StatusRequest(), 5, failover_s=within_s,
                    leader_only=True)

    def _next(self, error_text):
        """After a failure on the current controller: the one a standby named, else the next."""
        hint = _LEADER_HINT.search(error_text or "")
        if hint and hint.group(1) in self._addresses:
            self._current = self._addresses.index(hint.group(1))
        else:
            self._current = (self._current + 1) % len(self._addresses)

    def _unary(self, name, request, timeout, failover_s=None, leader_only=None):
        """Calls ``name`` on the leader; with several controllers, moves on (UNAVAILABLE: a
        standby, one taking over, or one that does not answer) until ``failover_s``."""
        if leader_only is None:
            leader_only = name in ("Plan", "Step", "Rollback")
        deadline = time.monotonic() + (failover_s if failover_s is not None
                                       else self._failover_s)
        tried = 0
        while True:
            address = self.leader
            _, stub = self._connect(address)
            error = None
            try:
                response = getattr(stub, name)(request, timeout=timeout, metadata=self._metadata)
                if not (leader_only and name == "Status" and len(self._addresses) > 1
                        and response.leadership.enabled
                        and response.leadership.state != "leader"):
                    return response
                error = WeightbeamError(
                    f"controller {address} is {response.leadership.state} "
                    f"[wb-leader: {response.leadership.leader}]", "UNAVAILABLE")
            except grpc.RpcError as e:
                error = from_rpc_error(e, f"{name} on controller {address}")
            tried += 1
            retry = len(self._addresses) > 1 and error.code == "UNAVAILABLE"
            if not retry or time.monotonic() >= deadline:
                if name == "Step" and error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise StepFailed(error.message, None, error.code) from None
                raise error from None
            self._next(error.message)
            if name == "Step":
                # The version may have committed before the answer was lost: the new leader
                # answers "already committed" rather than refusing it as not newer.
                request.retry = True
            if tried % len(self._addresses) == 0:
                time.sleep(0.2)  # a round without a leader: the election is still running


class StepHandle:
    """One step started with ControllerClient.step_async: its answers as they come.

    With controllers in high availability, a leader that goes before every sender captured
    (UNAVAILABLE) is left for the new one: the step is started there again (a retry, so a
    version the old leader committed is answered as committed). After the capture it is not:
    the trainer may already hold newer weights, which a new capture would send as this
    version; the handle then raises and the loop steps its next version."""

    def __init__(self, version, call, address, failover=None):
        self.version = version
        self._call = call
        self._address = address
        self._failover = failover  # (error) -> (call, address) or None
        self._changed = threading.Condition()
        self._captured = None  # StepCaptured
        self._result = None  # StepResult
        self._error = None  # WeightbeamError: the call ended without a result
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"weightbeam-step-{version}")
        self._reader.start()

    def _read(self):
        while True:
            error = self._read_call()
            with self._changed:
                before_capture = self._captured is None and self._result is None
            if (error is None or error.code != "UNAVAILABLE" or not before_capture
                    or self._failover is None):
                break
            try:
                again = self._failover(error)
            except grpc.RpcError:
                again = None
            if again is None:
                break
            self._call, self._address = again
        self._finish(error)

    def _read_call(self):
        """Reads the call to its end: None, or the error it ended with."""
        try:
            for progress in self._call:
                with self._changed:
                    if progress.HasField("captured"):
                        self._captured = progress.captured
                    if progress.HasField("result"):
                        self._result = progress.result
                    self._changed.notify_all()
        except grpc.RpcError as e:
            error = from_rpc_error(e, f"StepAsync on controller {self._address}")
            if error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
                error = StepFailed(error.message, None, error.code)
            return error
        return None

    def _finish(self, error):
        with self._changed:
            if self._result is None:
                self._error = error or WeightbeamError(
                    f"step {self.version}: the controller ended the call without a result",
                    "UNAVAILABLE")
            self._changed.notify_all()

    def _failed(self):
        r = self._result
        return StepFailed(r.error or f"step {self.version} failed", r)

    def wait_captured(self, timeout=None):
        """Returns the StepCaptured (version, seconds, how) once every sender has captured;
        raises StepFailed if the step failed first, StepTimeout after ``timeout`` seconds
        (None: no limit)."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._captured is not None or self._result is not None
                    or self._error is not None, timeout):
                raise StepTimeout(f"step {self.version}: the senders had not all captured "
                                  f"within {timeout} s")
            if self._captured is not None:
                return self._captured
            if self._result is not None:
                if not self._result.ok:
                    raise self._failed()
                return controller_pb2.StepCaptured(
                    version=self.version, seconds=self._result.trainer_stall_seconds,
                    how=self._result.capture)
            raise self._error

    def captured(self):
        """Whether every sender has captured (without waiting)."""
        with self._changed:
            return self._captured is not None

    def result(self, timeout=None):
        """The StepResult once the step committed; raises StepFailed as step() does, or
        StepTimeout after ``timeout`` seconds (None: no limit)."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._result is not None or self._error is not None, timeout):
                raise StepTimeout(f"step {self.version}: no result within {timeout} s")
            if self._result is not None:
                if not self._result.ok:
                    raise self._failed()
                return self._result
            raise self._error

    def cancel(self):
        """Stops listening (the step itself goes on in the controller)."""
        self._call.cancel()
