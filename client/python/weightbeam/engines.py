"""Register an inference engine's parameters (vLLM, SGLang) or a trainer's shards (Hugging Face
FSDP shards, Megatron-core parameters, DTensor local shards) with one call per worker.

The layout (which box of which HF tensor lands where in which engine parameter or trainer tensor,
FP8 scales, vocab padding) is computed by the node agent from the model's config.json (the Local
``EngineLayout`` / ``SourceLayout`` / ``TrainerLayout`` RPCs, served from the C++
``common/engines``): this module only checks the given tensors against it and registers each part
as a view of its tensor (docs/trainers.md for the trainer dialects).

    named = dict(model.named_parameters())          # engine names, on this rank
    register_engine_params(session, named, "config.json", "vllm", tp=4, tp_rank=rank)

Every tensor is checked (shape, dtype) before anything is registered: a mismatch raises one
WeightbeamError naming the parameter, and nothing is registered.
"""

import json
import os

import grpc

from weightbeam import _stubs
from weightbeam.dtypes import to_dtype
from weightbeam.errors import WeightbeamError, from_rpc_error

local_pb2 = _stubs.local_pb2
types_pb2 = _stubs.types_pb2

_DTYPE_NAMES = {types_pb2.DTYPE_BF16: "bf16", types_pb2.DTYPE_F32: "f32",
                types_pb2.DTYPE_F8_E4M3: "f8_e4m3"}


def config_json(config):
    """config.json text from a path, a JSON string or a dict."""
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, str) and not config.lstrip().startswith("{") and os.path.exists(config):
        with open(config) as f:
            return f.read()
    if isinstance(config, str):
        return config
    raise TypeError(f"config: expected a path, JSON text or a dict, not {type(config).__name__}")


def engine_layout(session, config, engine, tp, tp_rank, ep=1, ep_rank=None, fp8=False):
    """The engine parameters of rank (tp_rank, ep_rank) as ``EngineParam`` messages (name, dtype,
    shape, parts: source, source_shape, box, offset)."""
    request = local_pb2.EngineLayoutRequest(
        config_json=config_json(config), engine=engine, tp=int(tp), tp_rank=int(tp_rank),
        ep=int(ep), ep_rank=-1 if ep_rank is None else int(ep_rank), fp8=bool(fp8))
    return list(_unary(session, "EngineLayout", request).params)


def source_layout(session, config, rank, world, align_rows=1, whole_small=False):
    """Every HF tensor with the dim-0 ``rows`` (start, size) FSDP rank ``rank`` of ``world``
    holds (chunks of ceil(rows / world) rounded up to ``align_rows``; with ``align_rows`` > 1
    each tensor's chunks start on the rank after the previous tensor's last, so small tensors
    spread over every rank). ``whole_small`` (with ``align_rows`` > 1): a tensor of fewer
    ``align_rows`` blocks than ranks is held whole by one rank, so FP8 inference weights get
    one transfer op per row-parallel shard instead of one per 128x128 tile."""
    request = local_pb2.SourceLayoutRequest(config_json=config_json(config), rank=int(rank),
                                            world=int(world), align_rows=int(align_rows),
                                            whole_small=bool(whole_small))
    return list(_unary(session, "SourceLayout", request).tensors)


def register_engine_params(session, named_params, config, engine, tp, tp_rank, ep=1,
                           ep_rank=None, fp8=False):
    """Registers every engine parameter of this rank. ``named_params``: engine name -> tensor
    (host tensors made with ``torch.frombuffer`` on a SharedBuffer, or CUDA tensors), FP8
    weights as uint8 (or float8_e4m3fn) with their ``<name>_scale_inv`` float32 beside them.
    Names the layout does not know (derived buffers, rotary caches) are ignored. Returns the
    number of parts registered."""
    params = engine_layout(session, config, engine, tp, tp_rank, ep, ep_rank, fp8)
    for p in params:
        if p.name not in named_params:
            raise WeightbeamError(
                f"engine parameter '{p.name}' ({engine} tp {tp} rank {tp_rank}): not in "
                "named_params", "INVALID_ARGUMENT")
        _check_tensor(p.name, named_params[p.name], list(p.shape), p.dtype, "engine parameter")
    parts = []
    for p in params:
        tensor = named_params[p.name]
        for part in p.parts:
            parts.append(dict(
                name=part.source, dtype=_DTYPE_NAMES[p.dtype],
                global_shape=list(part.source_shape),
                shard=[(b.start, b.size) for b in part.box], buffer=tensor,
                view=(list(p.shape), list(part.offset), p.name)))
    return _register_all(session, parts)


def register_hf_shards(session, named_shards, config, rank, world, align_rows=1,
                       whole_small=False):
    """Registers a trainer rank's Hugging Face-named FSDP shards: ``named_shards`` maps each HF
    name to this rank's dim-0 shard (rows as ``source_layout`` says; BF16, float32 for
    DeepSeek's e_score_correction_bias). Tensors of which this rank holds no rows may be
    absent. Returns the number of tensors registered."""
    registrations = []
    for t in source_layout(session, config, rank, world, align_rows, whole_small):
        if t.rows.size == 0:
            continue
        if t.name not in named_shards:
            raise WeightbeamError(
                f"source tensor '{t.name}': trainer rank {rank} of {world} holds rows "
                f"[{t.rows.start}, {t.rows.start + t.rows.size}) but it is not in named_shards",
                "INVALID_ARGUMENT")
        shape = [t.rows.size] + list(t.shape[1:])
        _check_tensor(t.name, named_shards[t.name], shape, t.dtype, "source tensor")
        registrations.append(dict(
            name=t.name, dtype=_DTYPE_NAMES[t.dtype], global_shape=list(t.shape),
            shard=[(t.rows.start, t.rows.size)] + [(0, d) for d in t.shape[1:]],
            buffer=named_shards[t.name]))
    return _register_all(session, registrations)


def megatron_layout(session, config, tp=1, tp_rank=0, pp=1, pp_rank=0, ep=1, ep_rank=0, etp=1,
                    etp_rank=0, dp=1, dp_rank=0, layers=None, vocab_divisible_by=128,
                    sequential_experts=False):
    """Every tensor Megatron-core rank (tp_rank, pp_rank, ep_rank, etp_rank) holds, as
    ``TrainerTensor`` messages (name, dtype, shape, parts). ``layers``: this stage's global
    layers (uneven splits, virtual pipeline chunks), numbered locally from 0; None: the uniform
    split num_hidden_layers / pp."""
    m = local_pb2.MegatronParallel(
        tp=int(tp), tp_rank=int(tp_rank), pp=int(pp), pp_rank=int(pp_rank), ep=int(ep),
        ep_rank=int(ep_rank), etp=int(etp), etp_rank=int(etp_rank), dp=int(dp),
        dp_rank=int(dp_rank), stage_layers_given=layers is not None,
        stage_layers=[int(x) for x in (layers or [])],
        vocab_divisible_by=int(vocab_divisible_by), sequential_experts=bool(sequential_experts))
    request = local_pb2.TrainerLayoutRequest(config_json=config_json(config), megatron=m)
    return list(_unary(session, "TrainerLayout", request).tensors)


def dtensor_layout(session, config, mesh, coords, placements, fused_experts=False):
    """Every tensor a DTensor rank holds. ``placements``: one placement string for every tensor
    ("R,S(0)") or a list of (pattern, placements) pairs, first match wins ('*' matches any
    characters; unmatched tensors are replicated). Per mesh dim: R (Replicate), S(d) (Shard,
    torch.chunk pieces), SS(d) (_StridedShard: cut after the plain shards, TP-major)."""
    if isinstance(placements, str):
        placements = [("*", placements)]
    rules = [local_pb2.PlacementRule(pattern=p, placements=_placement_text(q))
             for p, q in placements]
    d = local_pb2.DTensorMesh(mesh=[int(x) for x in mesh], coords=[int(x) for x in coords],
                              rules=rules, fused_experts=bool(fused_experts))
    request = local_pb2.TrainerLayoutRequest(config_json=config_json(config), dtensor=d)
    return list(_unary(session, "TrainerLayout", request).tensors)


def register_megatron_params(session, named_params, config, tp=1, tp_rank=0, pp=1, pp_rank=0,
                             ep=1, ep_rank=0, etp=1, etp_rank=0, dp=1, dp_rank=0, layers=None,
                             vocab_divisible_by=128, sequential_experts=False):
    """Registers a Megatron-core rank's parameters as they are (``model.named_parameters()``
    names, plus the routers' ``expert_bias`` buffers, float32): each HF box a tensor holds
    becomes one view of it. Every data-parallel copy registers too (its ranks are alternative
    sources). A name the layout does not list (a layer of another stage, an expert of another
    EP rank) or a wrong shape / dtype raises one WeightbeamError naming it, and nothing is
    registered. Returns the number of parts registered.

    Given the model instead (a Megatron-core ``GPTModel``, under DDP / Float16Module too) and
    no ranks: everything is read from the model and ``megatron.core.parallel_state``
    (weightbeam.megatron_params), host parameters are mirrored into a SharedBuffer, and the
    returned ``MegatronParams`` has ``copy_shards()`` (before each push) and ``close()``."""
    from weightbeam import megatron_params
    if megatron_params.is_model(named_params):
        given = dict(tp=tp, tp_rank=tp_rank, pp=pp, pp_rank=pp_rank, ep=ep, ep_rank=ep_rank,
                     etp=etp, etp_rank=etp_rank, dp=dp, dp_rank=dp_rank, layers=layers,
                     vocab_divisible_by=vocab_divisible_by,
                     sequential_experts=sequential_experts)
        defaults = dict(tp=1, tp_rank=0, pp=1, pp_rank=0, ep=1, ep_rank=0, etp=1, etp_rank=0,
                        dp=1, dp_rank=0, layers=None, vocab_divisible_by=128,
                        sequential_experts=False)
        passed = sorted(k for k in given if given[k] != defaults[k])
        if passed:
            raise WeightbeamError(
                f"register_megatron_params: given a model, the ranks and layers are read from "
                f"it and megatron.core.parallel_state; do not pass {', '.join(passed)}",
                "INVALID_ARGUMENT")
        return megatron_params.register_megatron_model(session, named_params, config)
    tensors = megatron_layout(session, config, tp, tp_rank, pp, pp_rank, ep, ep_rank, etp,
                              etp_rank, dp, dp_rank, layers, vocab_divisible_by,
                              sequential_experts)
    where = (f"megatron tp {tp_rank}/{tp} pp {pp_rank}/{pp} ep {ep_rank}/{ep} "
             f"etp {etp_rank}/{etp}")
    return _register_trainer(session, named_params, tensors, where,
                             lambda name: _megatron_stray(name, tensors, pp_rank, ep_rank))


def register_dtensor_params(session, model_or_named, config, mesh=None, coords=None,
                            placements=None, fused_experts=None):
    """Registers a DTensor rank's shards. With ``mesh`` None (torch 2.x): ``model_or_named`` is
    the model itself (or its named parameters, DTensors and plain tensors); mesh, coordinates,
    placements and local shards are read from the DTensor objects (``DTensorParams``, in
    weightbeam.dtensor_params), and the returned DTensorParams' ``copy_shards()`` goes before
    each push. Otherwise (torch 1.13, no DTensor): ``model_or_named`` maps Hugging Face names
    (or the Transformers-v5 fused ``mlp.experts.gate_up_proj`` / ``down_proj`` with
    ``fused_experts``) to this rank's local shards, ``mesh``, ``coords`` and ``placements`` as
    for ``dtensor_layout``; returns the number of parts registered. ``fused_experts`` None:
    detected from the names. Tensors of which this rank holds nothing may be absent. Same
    checks and all-or-nothing as register_megatron_params."""
    if mesh is None:
        if coords is not None or placements is not None:
            raise ValueError("register_dtensor_params: coords and placements go with mesh; "
                             "without mesh they are read from the DTensors")
        from weightbeam.dtensor_params import DTensorParams  # torch 2.x only
        params = DTensorParams(model_or_named, config, fused_experts=fused_experts)
        params.register(session)
        return params
    if fused_experts is None:
        fused_experts = any(n.endswith("mlp.experts.gate_up_proj") for n in model_or_named)
    tensors = dtensor_layout(session, config, mesh, coords, placements, fused_experts)
    where = f"dtensor mesh {list(mesh)} coordinates {list(coords)}"
    return _register_trainer(session, model_or_named, tensors, where, lambda name: None)


def _placement_text(p):
    return p if isinstance(p, str) else ",".join(p)


def _megatron_stray(name, tensors, pp_rank, ep_rank):
    """Why a Megatron name is not this rank's, when the name says so."""
    layers = {int(t.name.split(".")[2]) for t in tensors if t.name.startswith("decoder.layers.")}
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers" and parts[2].isdigit() \
            and int(parts[2]) not in layers:
        return (f"layer {parts[2]} of another stage: pp rank {pp_rank} holds {len(layers)} "
                "layer(s), numbered from 0")
    if ".experts." in name:
        return f"an expert of another EP rank: ep rank {ep_rank} does not hold it"
    return None


def _register_trainer(session, named, tensors, where, stray):
    by_name = {t.name: t for t in tensors}
    for name in named:
        if name not in by_name:
            why = stray(name) or "the layout does not list it"
            raise WeightbeamError(f"trainer tensor '{name}' ({where}): {why}",
                                  "INVALID_ARGUMENT")
    registrations = []
    for t in tensors:
        shape = list(t.shape)
        if not t.parts or 0 in shape:
            continue
        if t.name not in named:
            raise WeightbeamError(
                f"trainer tensor '{t.name}' ({where}): {_DTYPE_NAMES[t.dtype]} {shape} expected "
                "but not in the given tensors", "INVALID_ARGUMENT")
        tensor = named[t.name]
        dtype = _as_registered(t, tensor)
        _check_tensor(t.name, tensor, shape, dtype, "trainer tensor")
        for part in t.parts:
            box = [(b.start, b.size) for b in part.box]
            dense = len(t.parts) == 1 and all(o == 0 for o in part.offset) and \
                [s for _, s in box] == shape
            registrations.append(dict(
                name=part.source, dtype=_DTYPE_NAMES[dtype],
                global_shape=list(part.source_shape), shard=box, buffer=tensor,
                view=None if dense else (shape, list(part.offset), t.name)))
    return _register_all(session, registrations)


def _as_registered(layout_tensor, tensor):
    """The dtype a trainer tensor registers with: the layout's, except that Megatron-LM keeps
    ``router.expert_bias`` in BF16 until the first forward pass: a BF16 one registers as it is
    and the agent casts it to the engine's f32 on the way (the planner's float cast)."""
    if layout_tensor.name.endswith("router.expert_bias") and \
            layout_tensor.dtype == types_pb2.DTYPE_F32 and \
            _tensor_dtype(tensor) == types_pb2.DTYPE_BF16:
        return types_pb2.DTYPE_BF16
    return layout_tensor.dtype


def _register_all(session, registrations):
    """Registers in order; if the agent refuses one, withdraws those already registered."""
    done = []
    try:
        for r in registrations:
            session.register(**r)
            done.append(r["name"])
    except Exception:
        for name in done:
            try:
                session.unregister(name)
            except WeightbeamError:
                pass
        raise
    return len(done)


def _check_tensor(name, tensor, shape, dtype, what):
    got_shape = [int(d) for d in getattr(tensor, "shape", ())]
    if got_shape != shape:
        raise WeightbeamError(
            f"{what} '{name}': shape {got_shape} does not match the config's {shape}",
            "INVALID_ARGUMENT")
    got = _tensor_dtype(tensor)
    want = (types_pb2.DTYPE_F8_E4M3, types_pb2.DTYPE_U8) if dtype == types_pb2.DTYPE_F8_E4M3 \
        else (dtype,)
    if got not in want:
        raise WeightbeamError(
            f"{what} '{name}': dtype {getattr(tensor, 'dtype', '?')} is not "
            f"{_DTYPE_NAMES.get(dtype, dtype)}", "INVALID_ARGUMENT")
    if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
        raise WeightbeamError(f"{what} '{name}': not contiguous", "INVALID_ARGUMENT")


def _tensor_dtype(tensor):
    try:
        return to_dtype(tensor.dtype)
    except Exception:
        return None


def _unary(session, method, request):
    session._check_open()
    try:
        return getattr(session._stub, method)(request, timeout=60)
    except grpc.RpcError as e:
        raise from_rpc_error(e, f"{method} on the agent at {session._socket}") from None
