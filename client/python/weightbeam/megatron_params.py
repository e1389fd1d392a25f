"""Register a Megatron-core model straight from the model object: its parallel ranks and sizes
from ``megatron.core.parallel_state``, the stage's global layers from the model's layers
(``layer.layer_number``, 1-based), the padded vocabulary from the model, and host parameters
mirrored into one SharedBuffer the agent reads (``copy_shards()`` refreshes it before each push).

    held = register_megatron_model(session, model, "config.json")   # after parallel_state init
    ...                                                               # optimizer step
    held.copy_shards()                                                # then the controller step
    held.close()

Megatron is imported lazily (only here, and only when called). The layout (``TrainerLayout``
``megatron``) lists the TransformerEngine layer spec's names; the local spec
(``get_gpt_layer_local_spec``) holds the same tensors under other names, renamed here exactly as
Megatron's own ``sharded_state_dict_keys_map`` of that spec does (docs/trainers.md,
"Megatron-core from the model").
"""

import re

from weightbeam import engines
from weightbeam.errors import WeightbeamError
from weightbeam.host_mirror import HostMirror

# Local-spec name -> the TE-spec name the layout lists: TE fuses these norms into the next linear.
# Same tensor, same shape, same bytes; applied only where the layout lists the TE name and not
# the local one (MoE layers keep pre_mlp_layernorm, MLA keeps input_layernorm).
LOCAL_SPEC_RENAMES = [
    (re.compile(r"^(decoder\.layers\.\d+\.)input_layernorm\.weight$"),
     r"\1self_attention.linear_qkv.layer_norm_weight"),
    (re.compile(r"^(decoder\.layers\.\d+\.)pre_mlp_layernorm\.weight$"),
     r"\1mlp.linear_fc1.layer_norm_weight"),
]


def unwrap(model):
    """The Megatron module under DDP / Float16Module wrappers (each keeps it as ``.module``)."""
    import torch

    if isinstance(model, (list, tuple)):
        raise WeightbeamError(
            "a list of model chunks (virtual pipeline stages): register each chunk's tensors "
            "with engines.register_megatron_params(..., layers=...) instead", "INVALID_ARGUMENT")
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def parallel_ranks(parallel_state=None):
    """This rank's Megatron parallel sizes and ranks, as register_megatron_params takes them."""
    if parallel_state is None:
        from megatron.core import parallel_state
    ps = parallel_state
    if not ps.model_parallel_is_initialized():
        raise WeightbeamError("megatron.core.parallel_state is not initialised "
                              "(initialize_model_parallel first)", "FAILED_PRECONDITION")
    return dict(tp=ps.get_tensor_model_parallel_world_size(),
                tp_rank=ps.get_tensor_model_parallel_rank(),
                pp=ps.get_pipeline_model_parallel_world_size(),
                pp_rank=ps.get_pipeline_model_parallel_rank(),
                ep=ps.get_expert_model_parallel_world_size(),
                ep_rank=ps.get_expert_model_parallel_rank(),
                etp=ps.get_expert_tensor_parallel_world_size(),
                etp_rank=ps.get_expert_tensor_parallel_rank(),
                dp=ps.get_data_parallel_world_size(), dp_rank=ps.get_data_parallel_rank())


def model_tensors(model):
    """The rank's tensors under the model's names: parameters and the routers' expert_bias
    buffers."""
    named = dict(model.named_parameters())
    named.update({n: b for n, b in model.named_buffers() if n.endswith("router.expert_bias")})
    return named


def stage_layers(model):
    """The global layer numbers (0-based) of this stage's decoder layers, in local order."""
    decoder = getattr(model, "decoder", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise WeightbeamError(f"{type(model).__name__}: no decoder.layers (a GPTModel?)",
                              "INVALID_ARGUMENT")
    return [int(layer.layer_number) - 1 for layer in layers]


def vocab_divisible_by(model, tp):
    """The layout pads the vocab to a multiple of ``divisible_by x tp``: the model's own padded
    size (GPTModel.vocab_size, already padded by the trainer) divided by tp gives exactly it."""
    padded = int(getattr(model, "vocab_size", 0) or 0)
    if padded <= 0 or padded % tp:
        raise WeightbeamError(f"model vocab_size {padded} is not a multiple of tp {tp}",
                              "INVALID_ARGUMENT")
    return padded // tp


class MegatronParams:
    """A Megatron-core rank's tensors registered with its node agent: host tensors through one
    SharedBuffer mirror (refreshed by ``copy_shards``), CUDA tensors in place."""

    def __init__(self, session, named, listed):
        """``named``: layout name -> the model's tensor; ``listed``: layout name -> (shape,
        dtype) the layout expects."""
        self.session = session
        self._sources = named
        self._mirror = HostMirror(named, "megatron")
        self.registered = {n: self._mirror.views.get(n, t) for n, t in named.items()}

    def copy_shards(self):
        """The model's current host parameters into the registered memory; then waits for CUDA
        writers (sources_ready). Call after each optimizer step, before the step."""
        self._mirror.refresh(lambda name: self._sources[name].detach())
        if self.session is not None:
            self.session.sources_ready()

    def close(self):
        """Closes the session (the agent withdraws the tensors) and frees the mirror."""
        try:
            if self.session is not None:
                self.session, session = None, self.session
                session.close()
        finally:
            self.registered = {}
            self._mirror.close()


def register_megatron_model(session, model, config, parallel_state=None):
    """Registers this rank's Megatron-core ``GPTModel`` (under DDP / Float16Module wrappers too)
    with the agent of ``session`` and returns a ``MegatronParams`` (``copy_shards()`` before each
    push, ``close()``). Reads the ranks from ``parallel_state`` (default
    ``megatron.core.parallel_state``), the stage's layers, the padded vocab and whether experts
    are SequentialMLP (``local_experts.{j}``) from the model."""
    inner = unwrap(model)
    ranks = parallel_ranks(parallel_state)
    raw = model_tensors(inner)
    if not getattr(getattr(inner, "config", None), "num_moe_experts", None):
        # parallel_state sizes expert groups for a dense model too (etp defaults to tp).
        ranks.update(ep=1, ep_rank=0, etp=1, etp_rank=0)
    sequential = any(".mlp.experts.local_experts." in n for n in raw)
    args = dict(ranks, layers=stage_layers(inner),
                vocab_divisible_by=vocab_divisible_by(inner, ranks["tp"]),
                sequential_experts=sequential)
    listed = {t.name: t for t in engines.megatron_layout(session, config, **args)}
    named = {layout_name(n, listed): t for n, t in raw.items()}
    for name, t in named.items():
        want = listed.get(name)
        if want is not None and engines._tensor_dtype(t) != want.dtype:
            raise WeightbeamError(
                f"trainer tensor '{name}' ({_where(ranks)}): dtype {t.dtype} is not the "
                f"config's {engines._DTYPE_NAMES.get(want.dtype, want.dtype)} (the local spec's "
                "torch norms stay float32 until Float16Module casts the model, as Megatron's "
                "bf16 training does)", "INVALID_ARGUMENT")
    held = MegatronParams(session, named, listed)
    try:
        held.copy_shards()
        engines.register_megatron_params(session, held.registered, config, **args)
    except Exception:
        held.session = None  # the caller's session: close only the mirror
        held.close()
        raise
    return held


def layout_name(name, listed):
    """``name`` as the layout lists it: unchanged when listed, else the TE-spec name of a
    local-spec norm when that one is listed."""
    if name in listed:
        return name
    for pattern, te_name in LOCAL_SPEC_RENAMES:
        renamed = pattern.sub(te_name, name)
        if renamed != name and renamed in listed:
            return renamed
    return name


def is_model(obj):
    """Whether ``obj`` is a model to read (has named_parameters) rather than a name -> tensor
    mapping."""
    return hasattr(obj, "named_parameters") and not isinstance(obj, dict)


def _where(r):
    return (f"megatron tp {r['tp_rank']}/{r['tp']} pp {r['pp_rank']}/{r['pp']} "
            f"ep {r['ep_rank']}/{r['ep']} etp {r['etp_rank']}/{r['etp']}")

