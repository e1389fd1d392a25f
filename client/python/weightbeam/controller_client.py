"""The training loop's handle on the controller: plan once, then ``step(version)`` after every
optimizer step; plus the status queries. Mirrors the C++ ``wb::client::ControllerClient``."""

import os

import grpc

from weightbeam import _stubs
from weightbeam.errors import StepFailed, WeightbeamError, from_rpc_error

controller_pb2 = _stubs.controller_pb2
controller_pb2_grpc = _stubs.controller_pb2_grpc


def _read(path, what, binary=True):
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()
    except OSError as e:
        raise WeightbeamError(f"{what}: cannot read {path}: {e.strerror}", "INVALID_ARGUMENT")


class ControllerClient:
    """``ControllerClient("host:port")``; nothing is sent until the first call.

    For a controller with TLS: ``ca_file`` (verifies its certificate), ``cert_file`` and
    ``key_file`` (ours, for mutual TLS), ``server_name`` (the name its certificate carries, when
    not the host); ``token_file`` holds the shared call token. Each defaults to the environment:
    WB_TLS_CA, WB_TLS_CERT, WB_TLS_KEY, WB_TLS_SERVER_NAME, WB_TOKEN_FILE (as wbctl)."""

    def __init__(self, address, ca_file=None, cert_file=None, key_file=None, token_file=None,
                 server_name=None):
        self._address = address
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
        if ca_file or cert_file:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_file, "ca_file") if ca_file else None,
                private_key=_read(key_file, "key_file") if key_file else None,
                certificate_chain=_read(cert_file, "cert_file") if cert_file else None)
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    def plan(self, trainer_ranks=0, inference_replicas=0, inference_ranks_per_replica=0,
             wait_s=30.0, delta=None):
        """Waits (up to ``wait_s``) for the world to be complete, plans, loads the plan on the
        senders; returns the PlanSummary. All zeros: the world from the controller's config.
        ``delta``: True / False turns delta mode on / off for this plan (and the plans made
        after a layout change); None keeps the controller's configuration."""
        world = controller_pb2.ExpectedWorld(
            trainer_ranks=trainer_ranks, inference_replicas=inference_replicas,
            inference_ranks_per_replica=inference_ranks_per_replica)
        choice = {None: controller_pb2.DELTA_CHOICE_CONFIG, True: controller_pb2.DELTA_CHOICE_ON,
                  False: controller_pb2.DELTA_CHOICE_OFF}[delta]
        request = controller_pb2.PlanRequest(world=world, wait_ms=int(wait_s * 1000),
                                             delta=choice)
        return self._unary(self._stub.Plan, request, "Plan", wait_s + 60).summary

    def step(self, version, timeout_s=0, max_staleness=None, ready=()):
        """Pushes ``version`` to the inference side and returns the StepResult once committed.
        ``ready``: this process's trainer LocalSessions; their sources_ready() runs first, so
        that no agent reads weights the optimizer is still writing (other ranks call their own
        before the barrier that precedes this call).
        A failed step raises StepFailed with the controller's message (agent and cause) and the
        result. ``timeout_s`` 0 uses the controller's configured step timeout. With
        ``max_staleness`` the step first waits (within its timeout) until no inference replica
        left out of it would be more than that many versions behind (docs/elastic.md)."""
        for session in ready:
            session.sources_ready()
        request = controller_pb2.StepRequest(version=int(version),
                                             timeout_ms=int(timeout_s * 1000))
        if max_staleness is not None:
            request.max_staleness = int(max_staleness)
        result = self._unary(self._stub.Step, request, "Step", None).result
        if not result.ok:
            raise StepFailed(result.error or f"step {version} failed", result)
        return result

    def status(self):
        """The controller's StatusResponse: agents, plan, last committed version, recent steps."""
        return self._unary(self._stub.Status, controller_pb2.StatusRequest(), "Status", 30)

    def list_tensors(self, agent=""):
        """Every agent's (or one agent's) registered tensors: a list of AgentLayout."""
        request = controller_pb2.ListTensorsRequest(agent=agent)
        return list(self._unary(self._stub.ListTensors, request, "ListTensors", 30).layouts)

    def watch_steps(self):
        """Iterates over StepResults as the controller finishes steps (cancel by closing)."""
        try:
            yield from self._stub.WatchSteps(controller_pb2.WatchStepsRequest(),
                                             metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, f"WatchSteps on {self._address}") from None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _unary(self, method, request, what, timeout):
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            error = from_rpc_error(e, f"{what} on controller {self._address}")
            if what == "Step" and error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                raise StepFailed(error.message, None, error.code) from None
            raise error from None

