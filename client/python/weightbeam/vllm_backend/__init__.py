"""weightbeam as a vLLM weight-transfer backend (``WeightTransferConfig(backend="weightbeam")``).

vLLM loads this package's ``register`` through its ``vllm.general_plugins`` entry point in every
process it starts (API server, engine core, workers); it registers the worker engine and the
trainer engine lazily, by module path, so nothing here imports vLLM until the backend is used.

    # inference side: vllm serve MODEL --weight-transfer-config '{"backend": "weightbeam"}'
    # trainer side (every rank):
    from weightbeam.vllm_backend import WeightbeamTrainerInitInfo, DTensorShards
    engine = WeightTransferTrainerFactory.trainer_init(
        WeightbeamTrainerInitInfo(rank=rank, world=world, controller="ctl:7400", ...),
        client=HTTPVLLMWeightSyncClient(url), source=DTensorShards(model, "config.json"))
        # a Megatron-core model: source=MegatronShards(model, "config.json")
    engine.send_weights()        # after each optimizer step

docs/engines.md ("vLLM backend") has the whole story.
"""

BACKEND = "weightbeam"


def register():
    """Registers the ``weightbeam`` backend with vLLM's two factories (idempotent)."""
    from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                          WeightTransferTrainerFactory)
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "weightbeam.vllm_backend.worker", "WeightbeamWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, "weightbeam.vllm_backend.trainer", "WeightbeamTrainerWeightTransferEngine")


def __getattr__(name):
    # The trainer-side names, imported on first use (they import vLLM and torch).
    if name in ("WeightbeamTrainerInitInfo", "WeightbeamTrainerWeightTransferEngine",
                "DTensorShards", "MegatronShards"):
        from weightbeam.vllm_backend import trainer
        return getattr(trainer, name)
    if name in ("WeightbeamInitInfo", "WeightbeamWeightTransferEngine"):
        from weightbeam.vllm_backend import worker
        return getattr(worker, name)
    raise AttributeError(name)
