"""The trainer side of the weightbeam vLLM backend.

Every trainer rank builds the engine with ``WeightTransferTrainerFactory.trainer_init(
WeightbeamTrainerInitInfo(rank=..., ...), client=..., source=DTensorShards(model, config))``
(FSDP2 / DTensor) or ``source=MegatronShards(model, config)`` (Megatron-core): each rank
registers the shards it holds, as it holds them (DTensor local shards, Megatron TP / PP / EP
shards: no gather, no ``full_tensor()``), with its node's agent. The sending rank (rank 0) then initialises
the vLLM workers through the ``VLLMWeightSyncClient`` the user already has (HTTP or Ray) and
plans once. ``send_weights()`` after each optimizer step: every rank copies its local shards
into the registered host memory (CUDA shards are read in place), rank 0 drives
start_weight_update -> (update_weights || controller step) -> finish_weight_update, and every
rank returns only when the round is committed, or raises (StepFailed, naming the agent).
"""

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (ParamMeta, TrainerInitInfo,
                                                   TrainerWeightTransferEngine, WeightSource)

from weightbeam.controller_client import ControllerClient
from weightbeam import megatron_params
from weightbeam.dtensor_params import DTensorParams
from weightbeam.errors import StepFailed, WeightbeamError
from weightbeam.local_session import LocalSession
from weightbeam.vllm_backend.worker import DEFAULT_SOCKET, WeightbeamInitInfo

log = logging.getLogger("weightbeam.vllm")


@dataclass
class WeightbeamTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "weightbeam"
    world: int = 1  # trainer ranks
    agent_socket: str = DEFAULT_SOCKET  # this rank's node agent
    controller: str = "127.0.0.1:7400"
    replicas: int = 1  # inference replicas (vLLM engines)
    ranks_per_replica: int = 1  # the engines' tensor-parallel size
    # Passed to every vLLM worker's init_transfer_engine (WeightbeamInitInfo's fields).
    worker: dict = field(default_factory=dict)
    delta: Any = None  # True / False: delta mode on / off for the plan; None: the controller's
    first_version: int = 1
    step_timeout_s: float = 300.0
    plan_wait_s: float = 120.0
    # Versions checked before they go live (docs/clients.md): NaN / Inf refused; each replica
    # reports a digest of what it serves (StepResult.replica_digests, the worker's weight_info).
    check_finite: bool = False
    digest: bool = False
    # TLS and token for the controller (None: WB_TLS_* / WB_TOKEN_FILE from the environment).
    ca_file: Any = None
    cert_file: Any = None
    key_file: Any = None
    token_file: Any = None


class DTensorShards(WeightSource):
    """A trainer model's parameters as this rank holds them, as vLLM's WeightSource: the
    weightbeam.dtensor_params.DTensorParams of the model (DTensor parameters of FSDP2
    ``fully_shard`` / ``parallelize_module`` read from the objects: mesh, coordinates,
    placements and local shard; plain tensors count as replicated), which users without vLLM
    call the same way. Names are the model's (Hugging Face names for a ``transformers``
    model)."""

    def __init__(self, model, config):
        self.model = model
        self.config = config
        self.params = DTensorParams(model, config)
        self.session = None

    def metadata(self):
        return [ParamMeta(n, p.dtype, tuple(p.shape)) for n, p in self.params.named.items()]

    def __iter__(self):
        for name in self.params.named:
            yield name, self.params.local(name)

    def register(self, session):
        """Registers every non-empty local shard (host shards through one SharedBuffer that
        ``copy_shards`` refreshes; CUDA shards in place). Returns the parts registered."""
        self.session = session
        return self.params.register(session)

    def copy_shards(self):
        """Host shards into the registered memory (a local copy of this rank's own shard);
        then waits for CUDA writers (sources_ready)."""
        self.params.copy_shards()

    def close(self):
        try:
            if self.session is not None:
                self.session, session = None, self.session
                session.close()
        finally:
            self.params.close()


class MegatronShards(WeightSource):
    """A Megatron-core model's parameters as this rank holds them, as vLLM's WeightSource: a
    thin wrapper over weightbeam.megatron_params.register_megatron_model (which users without
    vLLM call as ``engines.register_megatron_params(session, model, config)``). ``model``: the
    rank's ``GPTModel``, under DDP / Float16Module wrappers too (one model chunk: virtual
    pipeline stages are refused); build it after ``megatron.core.parallel_state`` is
    initialised. ``register`` reads the TP / PP / EP / DP ranks from ``parallel_state``
    (default ``megatron.core.parallel_state``), the stage's layers and the padded vocab from the
    model.

    ``metadata()`` and iteration are the model's own tensors under Megatron names
    (``decoder.layers.0.self_attention.linear_qkv.weight``, ...), this rank's local shards with
    their local shapes: not Hugging Face names nor full shapes. One Megatron tensor holds
    several Hugging Face ones (fused QKV, gate/up), cut by TP, so those would need a gather and
    a conversion; weightbeam's engine does not read them (its agents move the registered shards
    and lay them out), only ``register`` / ``copy_shards`` / ``close``."""

    def __init__(self, model, config, parallel_state=None):
        self.model = model
        self.config = config
        self.parallel_state = parallel_state
        self.named = megatron_params.model_tensors(megatron_params.unwrap(model))
        self.params = None  # the MegatronParams register() returns
        self.session = None

    def metadata(self):
        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.named.items()]

    def __iter__(self):
        for name, t in self.named.items():
            yield name, t.detach()

    def register(self, session):
        """Registers every local tensor (host tensors through one SharedBuffer that
        ``copy_shards`` refreshes; CUDA tensors in place). Returns the number of tensors
        registered."""
        self.session = session
        self.params = megatron_params.register_megatron_model(
            session, self.model, self.config, parallel_state=self.parallel_state)
        return len(self.params.registered)

    def copy_shards(self):
        """Host tensors into the registered memory (a local copy of this rank's own shards);
        then waits for CUDA writers (sources_ready)."""
        if self.params is None:
            raise WeightbeamError("MegatronShards.copy_shards before register(session)",
                                  "FAILED_PRECONDITION")
        self.params.copy_shards()

    def close(self):
        params, self.params = self.params, None
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close()
        finally:
            if params is not None:
                params.session = None  # closed above
                params.close()


SOURCE_METHODS = ("register", "copy_shards", "close")


def check_source(source):
    """Raises ValueError unless ``source`` is one weightbeam registers: a DTensorShards, a
    MegatronShards, or any object with register(session) / copy_shards() / close()."""
    if isinstance(source, (DTensorShards, MegatronShards)):
        return
    missing = [m for m in SOURCE_METHODS if not callable(getattr(source, m, None))]
    if missing:
        raise ValueError(
            "the weightbeam trainer engine takes a weightbeam DTensorShards (FSDP2 / DTensor) "
            "or MegatronShards (Megatron-core) source, the rank's shards as it holds them (or "
            "any object with register(session) / copy_shards() / close()); got "
            f"{type(source).__name__}, which has no {' / '.join(missing)}")


class WeightbeamTrainerWeightTransferEngine(TrainerWeightTransferEngine):
    init_info_cls = WeightbeamTrainerInitInfo

    def __init__(self, *, client, source, info):
        super().__init__(client=client, source=source, is_sender=info.is_sender)
        self.info = info
        self.version = info.first_version - 1
        self.ctl = None
        self.last_result = None

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        check_source(source)
        engine = cls(client=client, source=source, info=init_info)
        session = LocalSession(init_info.agent_socket, "trainer", rank=init_info.rank)
        source.register(session)
        _barrier()
        error = None
        if engine.is_sender:
            try:
                engine._init_inference_side()
            except Exception as e:  # every rank raises, not only the sender
                error = f"{type(e).__name__}: {e}"
        error = _broadcast(error)
        if error:
            raise WeightbeamError(f"weightbeam trainer init: {error}", "UNAVAILABLE")
        return engine

    def _init_inference_side(self):
        info = self.info
        worker = dataclasses.asdict(WeightbeamInitInfo(**info.worker))
        start = time.monotonic()
        self.client.init_weight_transfer_engine(worker)
        log.info("weightbeam: vLLM workers initialised in %.2f s", time.monotonic() - start)
        self.ctl = ControllerClient(info.controller, ca_file=info.ca_file,
                                    cert_file=info.cert_file, key_file=info.key_file,
                                    token_file=info.token_file)
        self.ctl.plan(info.world, info.replicas, info.ranks_per_replica,
                      wait_s=info.plan_wait_s, delta=info.delta,
                      check_finite=info.check_finite, digest=info.digest)

    def send_weights(self, version=None):
        """Pushes this rank's current shards as ``version`` (default: the last one + 1); returns
        once every replica committed it, or raises StepFailed (every rank)."""
        v = int(version) if version is not None else self.version + 1
        self.source.copy_shards()
        _barrier()
        error = self._round(v) if self.is_sender else None
        error = _broadcast(error)
        if error:
            raise StepFailed(error, None)
        self.version = v

    def _round(self, v):
        self.client.start_weight_update()
        engine_error = {}

        def update():
            try:
                self.client.update_weights({"version": v,
                                            "timeout_s": self.info.step_timeout_s})
            except Exception as e:
                engine_error["error"] = f"{type(e).__name__}: {e}"
        t = threading.Thread(target=update, name="wb-vllm-update")
        t.start()
        step_error = None
        try:
            self.last_result = self.ctl.step(v, timeout_s=self.info.step_timeout_s)
        except WeightbeamError as e:
            step_error = str(e)
        t.join()
        if step_error or engine_error:
            return (f"version {v} was not committed: "
                    + "; ".join(x for x in (step_error and f"step: {step_error}",
                                            engine_error and f"engine: {engine_error['error']}")
                                if x))
        self.client.finish_weight_update(weight_version=str(v))
        return None

    def shutdown(self):
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        self.source.close()


def _distributed():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _barrier():
    if _distributed():
        torch.distributed.barrier()


def _broadcast(value):
    """Rank 0's ``value`` on every rank."""
    if not _distributed():
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]

