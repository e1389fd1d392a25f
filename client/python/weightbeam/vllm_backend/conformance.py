"""Does weightbeam's layout land what this vLLM's own loader lands? Checked once per engine
parameter role, on the running engine, before anything is registered.

For one module of each role (``model.layers.*.self_attn.qkv_proj``, the embedding, the head,
the experts of an MoE layer, ...) the check swaps in fresh tensors built from the metadata vLLM
recorded at model construction (its layerwise-reload machinery), feeds a known state dict through
the engine's own ``model.load_weights`` and the module's ``process_weights_after_loading``, and
compares every parameter byte for byte with what weightbeam's layout would write from the same
state dict. Then it puts the live tensors back, untouched: the cost is one module's memory and a
few milliseconds per role.

A module passes when every parameter has the layout's shape and dtype after processing, its
bytes equal the layout's, and processing derived no other state from them (a packed copy, a
kernel handle: vLLM's CPU linears keep a oneDNN handle and drop their weight). A module that
fails goes whole to the fallback path: its checkpoint tensors are landed in staging memory and
fed through the engine's own loader at ``finish_weight_update``.
"""

import hashlib
import re
from dataclasses import dataclass

import torch

IN_PLACE = "in place"
FALLBACK = "fallback"


@dataclass
class Row:
    """One engine parameter's path and why."""
    param: str
    path: str  # IN_PLACE or FALLBACK
    why: str
    probed: str  # the module the role was checked on


def role_of(module_path):
    """``model.layers.7.mlp.experts`` -> ``model.layers.*.mlp.experts``."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", module_path)


def check(model, layout):
    """Rows for every parameter of ``layout`` (EngineParam messages), one role probed once."""
    by_module = {}
    for p in layout:
        module_path, _, _ = p.name.rpartition(".")
        by_module.setdefault(module_path, []).append(p)
    holders = parameter_holders(model)
    verdicts = {}
    rows = []
    for module_path, params in by_module.items():
        role = role_of(module_path)
        if role not in verdicts:
            verdict = _shared_verdict(model, module_path, params, holders)
            verdicts[role] = (module_path, verdict or _verdict(model, module_path, params))
        probed, (ok, why) = verdicts[role]
        for p in params:
            rows.append(Row(p.name, IN_PLACE if ok else FALLBACK, why, probed))
    return rows


def parameter_holders(model):
    """id(parameter) -> every module path holding it (tied weights: more than one)."""
    holders = {}
    for path, module in model.named_modules(remove_duplicate=False):
        for t in module._parameters.values():
            if t is not None:
                paths = holders.setdefault(id(t), [])
                if path not in paths:
                    paths.append(path)
    return holders


def sharing_modules(model, module_path, holders):
    """The other modules holding one of ``module_path``'s parameters, with a quant method
    (whose processing may derive state from it)."""
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return []
    out = []
    for t in module._parameters.values():
        for path in holders.get(id(t), []) if t is not None else []:
            other = model.get_submodule(path)
            if path != module_path and other is not module and \
                    hasattr(getattr(other, "quant_method", None), "process_weights_after_loading"):
                out.append(path)
    return out


def _shared_verdict(model, module_path, params, holders):
    """A parameter another module also holds (a tied head) is checked on its owner only: the
    other's processing may derive state from it, so it goes to the fallback path, which
    re-processes every holder."""
    shared = sharing_modules(model, module_path, holders)
    if shared:
        return False, f"shared with {', '.join(shared)}, which may derive state from it"
    return None


def format_table(rows):
    width = max([len(r.param) for r in rows] + [9])
    lines = [f"{'parameter':<{width}}  {'path':<8}  why"]
    lines += [f"{r.param:<{width}}  {r.path:<8}  {r.why}" for r in rows]
    return "\n".join(lines)


def probe_tensor(name, shape, dtype):
    """A known tensor for ``name``: normal values from a seed of the name (the same on every
    rank and every run), never zero, so a misplaced box cannot pass for a right one."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") % (2**63)
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(tuple(shape), generator=g, dtype=torch.float32) * 0.1 + 0.5
    return t.to(dtype)


def _verdict(model, module_path, params):
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return False, f"no module '{module_path}' in this vLLM's model"
    for p in params:
        attr = p.name.rpartition(".")[2]
        live = module._parameters.get(attr)
        if live is None:
            return False, f"{type(module).__name__} has no parameter '{attr}'"
        want = tuple(p.shape)
        if tuple(live.shape) != want:
            return False, (f"'{attr}' is {list(live.shape)} in the running engine, the layout "
                           f"writes {list(want)}: repacked after loading")
    try:
        from weightbeam.vllm_backend.torch_dtypes import torch_dtype
        sources = {}
        for p in params:
            for part in p.parts:
                sources.setdefault(part.source, (list(part.source_shape), torch_dtype(p.dtype)))
        probe = {n: probe_tensor(n, s, d) for n, (s, d) in sources.items()}
        loaded, derived = _scratch_load(model, module, probe)
    except Exception as e:  # an engine whose loader cannot run on a scratch module: fall back
        return False, f"the check could not run: {type(e).__name__}: {e}"
    if derived:
        return False, ("the engine derives " + ", ".join(sorted(derived)) +
                       " from it after loading")
    for p in params:
        why = _compare(p, loaded.get(p.name.rpartition(".")[2]), probe)
        if why:
            return False, why
    return True, "matches the engine's loader byte for byte"


def _compare(param, got, probe):
    attr = param.name.rpartition(".")[2]
    if got is None:
        return f"the engine's loader left no '{attr}'"
    if tuple(got.shape) != tuple(param.shape):
        return (f"after the engine's load and processing '{attr}' is {list(got.shape)}, the "
                f"layout writes {list(param.shape)}")
    for part in param.parts:
        src = probe[part.source]
        sub = src[tuple(slice(b.start, b.start + b.size) for b in part.box)]
        sub = sub.reshape((1,) * (got.dim() - sub.dim()) + tuple(sub.shape))
        dst = got[tuple(slice(o, o + s) for o, s in zip(part.offset, sub.shape))]
        if dst.dtype != sub.dtype:
            return f"'{attr}' is {dst.dtype} after loading, the layout writes {sub.dtype}"
        a = dst.contiguous().flatten().view(torch.uint8)
        b = sub.contiguous().flatten().view(torch.uint8)
        if not torch.equal(a, b):
            return (f"bytes differ: the engine's loader puts other values where the layout writes "
                    f"'{part.source}' at offset {list(part.offset)}")
    return ""


def _scratch_load(model, module, probe):
    """Loads ``probe`` into fresh tensors of ``module`` through the engine's own loader and
    processing; returns (parameters after processing, names of state processing derived). The
    module's live tensors and attributes are put back before returning."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import (SKIP_TENSORS, materialize_layer,
                                                              restore_layer_on_meta)
    saved = dict(module.__dict__)
    saved_params = dict(module._parameters)
    saved_buffers = dict(module._buffers)
    saved_non_persistent = set(module._non_persistent_buffers_set)
    try:
        # Tensors the reload machinery leaves in place (bias, expert maps) get private copies,
        # so that nothing the probe loads reaches a live tensor.
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is not None and name in SKIP_TENSORS:
                    store[name] = _private_copy(t)
        info = get_layerwise_info(module)
        restore_layer_on_meta(module, info)
        materialize_layer(module, info)
        before_tensors = set(module._parameters) | set(module._buffers)
        with torch.no_grad():
            model.load_weights(iter(probe.items()))
        before = {k: id(v) for k, v in module.__dict__.items() if not k.startswith("_")}
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            with torch.no_grad():
                quant_method.process_weights_after_loading(module)
        derived = {k for k, v in module.__dict__.items()
                   if not k.startswith("_") and before.get(k) != id(v)}
        derived |= (set(module._parameters) | set(module._buffers)) - before_tensors
        loaded = {n: t.detach().clone() for n, t in module._parameters.items() if t is not None}
        return loaded, derived
    finally:
        module.__dict__.clear()
        module.__dict__.update(saved)
        module.__dict__["_parameters"] = saved_params
        module.__dict__["_buffers"] = saved_buffers
        module.__dict__["_non_persistent_buffers_set"] = saved_non_persistent


def _private_copy(t):
    copy = t.detach().clone()
    if isinstance(t, torch.nn.Parameter):
        copy = torch.nn.Parameter(copy, requires_grad=False)
    copy.__dict__.update(t.__dict__)
    return copy
