"""Does weightbeam's layout land what this vLLM's own loader lands? Checked once per engine
parameter role, on the running engine, before anything is registered.

For one module of each role (``model.layers.*.self_attn.qkv_proj``, the embedding, the head,
the experts of an MoE layer, ...) the check swaps in fresh tensors built from the metadata vLLM
recorded at model construction (its layerwise-reload machinery), feeds a known state dict through
the engine's own ``model.load_weights`` and the module's ``process_weights_after_loading``, and
compares every parameter byte for byte with what weightbeam's layout would write from the same
state dict. Then it puts the live tensors back, untouched: the cost is one module's memory and a
few milliseconds per role.

A module is written in place when every parameter has the layout's shape and bytes after
loading, processing leaves those bytes as they are, and no other module holds them. If its
processing derives other state from them (vLLM's fused-MoE kernel), it is written in place and
its processing runs again at ``finish_weight_update`` (REPROCESS). Any other module (vLLM's
CPU linears drop their weight and keep a oneDNN handle) goes whole to the fallback path: its
checkpoint tensors land in staging memory and go through the engine's own loader at
``finish_weight_update``.
"""

import hashlib
import re
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

IN_PLACE = "in place"
# Written in place, then the module's own post-load processing runs again at finish (it derives
# state, a kernel for instance, from bytes it leaves as the loader wrote them).
REPROCESS = "in place + reprocess"
FALLBACK = "fallback"


@dataclass
class Row:
    """One engine parameter's path and why."""
    param: str
    path: str  # IN_PLACE, REPROCESS or FALLBACK
    why: str
    probed: str  # the module the role was checked on
    module: str = ""  # the module that holds the parameter in this vLLM


def resolve(model, name):
    """(module path, attribute) of the live tensor behind layout parameter ``name``: the named
    module's own parameter, or else the one parameter of that name among its descendants
    (vLLM 0.32 keeps a MoE layer's ``experts.w13_weight`` in ``experts.routed_experts``)."""
    module_path, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return module_path, attr
    if module._parameters.get(attr) is not None:
        return module_path, attr
    found = [f"{module_path}.{sub}" if sub else module_path
             for sub, m in module.named_modules() if m._parameters.get(attr) is not None]
    return (found[0], attr) if len(found) == 1 else (module_path, attr)


def live_tensor(model, name):
    module_path, attr = resolve(model, name)
    return model.get_submodule(module_path)._parameters[attr]


def role_of(module_path):
    """``model.layers.7.mlp.experts`` -> ``model.layers.*.mlp.experts``."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", module_path)


def check(model, layout):
    """Rows for every parameter of ``layout`` (EngineParam messages), one role probed once."""
    by_module = {}
    for p in layout:
        by_module.setdefault(resolve(model, p.name)[0], []).append(p)
    holders = parameter_holders(model)
    verdicts = {}
    rows = []
    for module_path, params in by_module.items():
        role = role_of(module_path)
        if role not in verdicts:
            verdict = _shared_verdict(model, module_path, params, holders)
            verdicts[role] = (module_path, verdict or _verdict(model, module_path, params))
        probed, (path, why) = verdicts[role]
        for p in params:
            rows.append(Row(p.name, path, why, probed, module_path))
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
        return FALLBACK, f"shared with {', '.join(shared)}, which may derive state from it"
    return None


def format_table(rows):
    width = max([len(r.param) for r in rows] + [9])
    lines = [f"{'parameter':<{width}}  {'path':<20}  why"]
    lines += [f"{r.param:<{width}}  {r.path:<20}  {r.why}" for r in rows]
    return "\n".join(lines)


def probe_tensor(name, shape, dtype):
    """A known tensor for ``name``: normal values from a seed of the name (the same on every
    rank and every run), never zero, so a misplaced box cannot pass for a right one."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") % (2**63)
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(tuple(shape), generator=g, dtype=torch.float32) * 0.1 + 0.5
    return t.to(dtype)


def _verdict(model, module_path, params):
    """(IN_PLACE | REPROCESS | FALLBACK, why) for the module holding ``params``."""
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return FALLBACK, f"no module '{module_path}' in this vLLM's model"
    for p in params:
        attr = p.name.rpartition(".")[2]
        live = module._parameters.get(attr)
        if live is None:
            return FALLBACK, f"{type(module).__name__} has no parameter '{attr}'"
        want = tuple(p.shape)
        if tuple(live.shape) != want:
            return FALLBACK, (f"'{attr}' is {list(live.shape)} in the running engine, the "
                              f"layout writes {list(want)}: repacked after loading")
    try:
        from weightbeam.vllm_backend.torch_dtypes import torch_dtype
        sources = {}
        for p in params:
            for part in p.parts:
                sources.setdefault(part.source, (list(part.source_shape), torch_dtype(p.dtype)))
        probe = {n: probe_tensor(n, s, d) for n, (s, d) in sources.items()}
        loaded, processed, derived = _scratch_load(model, module, probe)
    except Exception as e:  # an engine whose loader cannot run on a scratch module: fall back
        return FALLBACK, f"the check could not run: {type(e).__name__}: {e}"
    for p in params:
        attr = p.name.rpartition(".")[2]
        why = _compare(p, loaded.get(attr), probe)
        if why:
            return FALLBACK, why
    changed = [a for a, t in loaded.items()
               if a not in processed or not _same_bytes(t, processed[a])]
    if changed:
        return FALLBACK, ("the engine's processing after loading rewrites " +
                          ", ".join(f"'{a}'" for a in sorted(changed)))
    if derived:
        return REPROCESS, ("matches the engine's loader byte for byte; its processing derives " +
                           ", ".join(sorted(derived)) + " from it: run again at finish")
    return IN_PLACE, "matches the engine's loader byte for byte"


def _same_bytes(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().flatten().view(torch.uint8),
                       b.contiguous().flatten().view(torch.uint8))


def _compare(param, got, probe):
    attr = param.name.rpartition(".")[2]
    if got is None:
        return f"the engine's loader left no '{attr}'"
    if got.numel() and not bool(got.flatten().view(torch.uint8).any()):
        return (f"the engine's loader put the probe for '{attr}' somewhere else, not into the "
                "module's own tensor (a wrong source, or references of the loader's own)")
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
    quant_method = getattr(module, "quant_method", None)
    saved_qm = dict(vars(quant_method)) if quant_method is not None else None
    wrote_live = set()
    guard = None
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
        for t in module._parameters.values():
            if t is not None:
                _unwrap_loader(t)
        before_tensors = set(module._parameters) | set(module._buffers)
        with torch.no_grad():
            for t in module._parameters.values():
                if t is not None:
                    t.zero_()  # the probe is never zero: what stays zero was not loaded
            fresh = {t.untyped_storage().data_ptr() for t in module._parameters.values()
                     if t is not None}
            with _WriteGuard(fresh) as guard:
                model.load_weights(iter(probe.items()))
        loaded = {n: t.detach().clone() for n, t in module._parameters.items() if t is not None}
        # A loader that keeps references of its own may write the live tensor, not the fresh
        # one: take what it wrote there (the guard puts the live bytes back afterwards).
        for n, t in list(loaded.items()):
            live = saved_params.get(n)
            if live is not None and t.numel() and not bool(t.flatten().view(torch.uint8).any()) \
                    and tuple(live.shape) == tuple(t.shape) and guard.wrote(live):
                loaded[n] = live.detach().clone()
                wrote_live.add(n)
        if quant_method is not None:
            first_load(quant_method)  # processing as at the engine's first load
        before = _state_ids(module)
        before_qm = _state_ids(quant_method) if quant_method is not None else {}
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            with torch.no_grad():
                quant_method.process_weights_after_loading(module)
        after = _state_ids(module)
        derived = {k for k, v in after.items() if before.get(k) != v and not k.startswith("p:")}
        derived |= (set(module._parameters) | set(module._buffers)) - before_tensors
        if quant_method is not None:
            derived |= {f"quant_method.{k}" for k, v in _state_ids(quant_method).items()
                        if before_qm.get(k) != v and not k.startswith("p:")}
        processed = {n: t.detach().clone() for n, t in module._parameters.items()
                     if t is not None}
        for n in wrote_live:  # processing ran on the fresh tensor; its bytes say nothing
            processed[n] = loaded[n]
            derived.add(f"its kernel (the loader writes the live '{n}')")
        return loaded, processed, derived
    finally:
        if guard is not None:
            guard.undo()  # whatever the loader wrote outside the scratch tensors, live ones too
        module.__dict__.clear()
        module.__dict__.update(saved)
        module.__dict__["_parameters"] = saved_params
        module.__dict__["_buffers"] = saved_buffers
        module.__dict__["_non_persistent_buffers_set"] = saved_non_persistent
        if quant_method is not None:  # its kernel must keep pointing at the live tensors
            vars(quant_method).clear()
            vars(quant_method).update(saved_qm)


def _unwrap_loader(t):
    """A vLLM layerwise reload leaves its buffering wrappers ("online_process_loader") on the
    metadata the scratch tensors are made from; the probe needs the loader itself."""
    loader = getattr(t, "weight_loader", None)
    while getattr(loader, "__name__", "") == "online_process_loader" and \
            hasattr(loader, "__wrapped__"):
        loader = loader.__wrapped__
    if loader is not None:
        t.weight_loader = loader


class _WriteGuard(TorchDispatchMode):
    """Records every tensor the probe's loading writes outside the scratch tensors (a loader
    with references of its own, a wrong layout sending a source into another module), saving
    its bytes first, so that ``undo`` puts the live model back exactly."""

    _WRITES = {torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar,
               torch.ops.aten.zero_.default}

    def __init__(self, scratch_storages):
        super().__init__()
        self.scratch = scratch_storages
        self.saved = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self._WRITES and isinstance(args[0], torch.Tensor):
            dst = args[0]
            if dst.untyped_storage().data_ptr() not in self.scratch:
                self.saved.append((dst, dst.detach().clone()))
        return func(*args, **(kwargs or {}))

    def wrote(self, tensor):
        """Whether the loading wrote into ``tensor``'s storage."""
        ptr = tensor.untyped_storage().data_ptr()
        return any(dst.untyped_storage().data_ptr() == ptr for dst, _ in self.saved)

    def undo(self):
        with torch.no_grad():
            for dst, before in reversed(self.saved):
                dst.copy_(before)
        self.saved.clear()


def first_load(quant_method):
    """Makes the next ``process_weights_after_loading`` run as at the engine's first load:
    vLLM's fused-MoE methods build their kernel only while ``moe_kernel`` is None, and on a
    weight update copy into the parameters instead (which, on vLLM 0.32's CPU build, leaves the
    kernel computing with the old experts)."""
    if getattr(quant_method, "moe_kernel", None) is not None:
        quant_method.moe_kernel = None


def _state_ids(obj):
    """name -> id of what ``obj`` holds: public attributes, and an nn.Module's submodules
    ("m:"), buffers ("b:") and parameters ("p:")."""
    ids = {k: id(v) for k, v in vars(obj).items() if not k.startswith("_")}
    for prefix, store in (("m:", "_modules"), ("b:", "_buffers"), ("p:", "_parameters")):
        for k, v in (vars(obj).get(store) or {}).items():
            ids[prefix + k] = id(v)
    return ids


def _private_copy(t):
    copy = t.detach().clone()
    if isinstance(t, torch.nn.Parameter):
        copy = torch.nn.Parameter(copy, requires_grad=False)
    copy.__dict__.update(t.__dict__)
    return copy
