"""Register an inference engine's parameters (vLLM, SGLang) or a trainer's Hugging Face shards
with one call per worker.

The layout (which box of which HF tensor lands where in which engine parameter, FP8 scales,
vocab padding) is computed by the node agent from the model's config.json (the Local
``EngineLayout`` / ``SourceLayout`` RPCs, served from the C++ ``common/engines``): this module
only checks the given tensors against it and registers each part as a view of its parameter.

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


def source_layout(session, config, rank, world, align_rows=1):
    """Every HF tensor with the dim-0 ``rows`` (start, size) FSDP rank ``rank`` of ``world``
    holds (chunks of ceil(rows / world) rounded up to ``align_rows``; with ``align_rows`` > 1
    each tensor's chunks start on the rank after the previous tensor's last, so small tensors
    spread over every rank)."""
    request = local_pb2.SourceLayoutRequest(config_json=config_json(config), rank=int(rank),
                                            world=int(world), align_rows=int(align_rows))
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


def register_hf_shards(session, named_shards, config, rank, world, align_rows=1):
    """Registers a trainer rank's Hugging Face-named FSDP shards: ``named_shards`` maps each HF
    name to this rank's dim-0 shard (rows as ``source_layout`` says; BF16, float32 for
    DeepSeek's e_score_correction_bias). Tensors of which this rank holds no rows may be
    absent. Returns the number of tensors registered."""
    registrations = []
    for t in source_layout(session, config, rank, world, align_rows):
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
