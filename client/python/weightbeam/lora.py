"""LoRA adapters into the engine (docs/clients.md "LoRA adapters").

A PEFT adapter's tensors (lora_A and lora_B of each target module, named as PEFT saves them:
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``) move as tensors of their
own, versioned like any other. The base weights are not touched.

Trainer side: ``AdapterSource(session, tensors)`` registers them (host tensors mirrored in one
SharedBuffer, CUDA tensors in place); ``copy()`` before each step.

Inference side: ``AdapterSlot(session, specs, peft_config, loader, workdir)`` registers host
destinations of the same names in the process that owns the engine and watches the agent. Each
received version is written as a PEFT directory (adapter_model.safetensors +
adapter_config.json) and loaded through the engine's own adapter path (``VllmAdapterLoader``:
vLLM's ``add_lora``); only a load that succeeded becomes ``slot.active``, the LoRARequest to
serve with. A failed load keeps the previous adapter active and says why (``slot.error``, the
log). With ``check=True`` (plans made with ``user_check=True``) the load happens on the staged
bytes before the commit, and a failed load refuses the version on every replica: the trainer's
step raises naming the engine's error.
"""

import json
import logging
import os
import shutil
import struct
import threading
import time

import numpy as np

from weightbeam.dtypes import itemsize, to_dtype
from weightbeam.errors import WeightbeamError
from weightbeam.shared_buffer import SharedBuffer
from weightbeam import _stubs

log = logging.getLogger("weightbeam.lora")
_types = _stubs.types_pb2

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
_ALIGN = 64
# safetensors' dtype names; NumPy holds BF16 as uint16 and FP8 as uint8 (raw bits).
_SAFETENSORS = {
    _types.DTYPE_F32: ("F32", np.float32), _types.DTYPE_F16: ("F16", np.float16),
    _types.DTYPE_BF16: ("BF16", np.uint16), _types.DTYPE_F8_E4M3: ("F8_E4M3", np.uint8),
    _types.DTYPE_I32: ("I32", np.int32), _types.DTYPE_I64: ("I64", np.int64),
    _types.DTYPE_U8: ("U8", np.uint8),
}
# Where each Llama-family target module sits and its (in, out) features, from config.json.
_MODULES = {
    "q_proj": ("self_attn", "hidden", "q"), "k_proj": ("self_attn", "hidden", "kv"),
    "v_proj": ("self_attn", "hidden", "kv"), "o_proj": ("self_attn", "q", "hidden"),
    "gate_proj": ("mlp", "hidden", "inter"), "up_proj": ("mlp", "hidden", "inter"),
    "down_proj": ("mlp", "inter", "hidden"),
}


# ---- the adapter's config and tensor names ---------------------------------------------------

def config_dict(peft_config):
    """The adapter's config as adapter_config.json holds it, from a PEFT ``LoraConfig``, a dict
    or the path of an adapter_config.json. Refused unless it is a LoRA with r, lora_alpha and
    target_modules."""
    if isinstance(peft_config, str):
        with open(peft_config) as f:
            peft_config = json.load(f)
    if hasattr(peft_config, "to_dict"):
        peft_config = peft_config.to_dict()
    cfg = json.loads(json.dumps(dict(peft_config), default=_jsonable))
    kind = str(cfg.get("peft_type", "LORA")).split(".")[-1].upper()
    missing = [k for k in ("r", "lora_alpha", "target_modules") if cfg.get(k) in (None, "")]
    if kind != "LORA" or missing:
        raise WeightbeamError(f"adapter config: peft_type {kind}, missing {missing}: a LoRA "
                              "config with r, lora_alpha and target_modules is needed",
                              "INVALID_ARGUMENT")
    cfg["peft_type"] = "LORA"
    return cfg


def adapter_specs(peft_config, model_config, dtype="f32"):
    """``{name: (shape, dtype)}`` of every lora_A / lora_B tensor the adapter holds on a
    Llama-family model (Llama, Mistral, Qwen2, Qwen3; config.json path or dict): what an
    AdapterSlot registers without seeing the trainer. Refuses what it cannot lay out
    (regex target_modules, rank_pattern, an MoE model's mlp), naming it."""
    cfg = config_dict(peft_config)
    mc = _model_config(model_config)
    targets = cfg["target_modules"]
    if isinstance(targets, str) or cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise WeightbeamError("adapter_specs: target_modules must be a list of module names "
                              "and rank_pattern / alpha_pattern empty; pass the specs yourself",
                              "INVALID_ARGUMENT")
    unknown = sorted(set(targets) - set(_MODULES))
    moe = any(k in mc for k in ("num_experts", "n_routed_experts", "num_local_experts"))
    if moe:
        unknown += sorted(m for m in targets if m in _MODULES and _MODULES[m][0] == "mlp")
    if unknown:
        raise WeightbeamError(f"adapter_specs: cannot lay out target modules {unknown} "
                              f"(known: {sorted(_MODULES)}, attention only on MoE models)",
                              "INVALID_ARGUMENT")
    dims = _dims(mc)
    layers = cfg.get("layers_to_transform")
    layers = range(mc["num_hidden_layers"]) if layers is None else \
        ([layers] if isinstance(layers, int) else layers)
    r, specs = int(cfg["r"]), {}
    for i in layers:
        for m in sorted(targets):
            parent, fan_in, fan_out = _MODULES[m]
            stem = f"base_model.model.model.layers.{i}.{parent}.{m}"
            specs[stem + ".lora_A.weight"] = ((r, dims[fan_in]), dtype)
            specs[stem + ".lora_B.weight"] = ((dims[fan_out], r), dtype)
    return specs


def _model_config(model_config):
    if isinstance(model_config, str):
        with open(model_config) as f:
            return json.load(f)
    return dict(model_config)


def _dims(mc):
    heads = mc["num_attention_heads"]
    head_dim = mc.get("head_dim") or mc["hidden_size"] // heads
    return {"hidden": mc["hidden_size"], "q": heads * head_dim,
            "kv": mc.get("num_key_value_heads", heads) * head_dim,
            "inter": mc["intermediate_size"]}


def _jsonable(x):
    if isinstance(x, (set, frozenset, tuple)):
        return sorted(x) if isinstance(x, (set, frozenset)) else list(x)
    return str(x)  # enums (peft_type, task_type)


# ---- trainer side ----------------------------------------------------------------------------

def peft_adapter(model, adapter_name="default"):
    """``(tensors, config)`` of a PEFT model's adapter: a callable giving PEFT's saved names ->
    the live tensors (``get_peft_model_state_dict``) and the adapter's config dict."""
    from peft import get_peft_model_state_dict

    def tensors():
        return get_peft_model_state_dict(model, adapter_name=adapter_name)

    return tensors, config_dict(model.peft_config[adapter_name])


class AdapterSource:
    """Trainer side: the adapter's tensors registered with the trainer's agent under their
    PEFT names, whole (adapters are small: one rank registers them). ``tensors``: name -> torch
    tensor, or a callable returning that (re-read at each copy()). Host tensors are mirrored in
    one SharedBuffer, refreshed by ``copy()`` before each step; CUDA tensors register in place
    (``ctl.step(v, ready=[session])`` waits for their writes)."""

    def __init__(self, session, tensors, label="lora"):
        from weightbeam.host_mirror import HostMirror  # torch, needed on this side only
        self._current = tensors if callable(tensors) else (lambda: tensors)
        named = self._current()
        bad = [n for n in named if not n.endswith((".lora_A.weight", ".lora_B.weight"))]
        if bad or not named:
            raise WeightbeamError(f"AdapterSource: expected lora_A / lora_B weights only, got "
                                  f"{bad[:3] or 'nothing'}", "INVALID_ARGUMENT")
        self._mirror = HostMirror(named, label)
        self.copy()
        for name, t in named.items():
            session.register(name, t.dtype, tuple(t.shape),
                             buffer=self._mirror.views.get(name, t))

    def copy(self):
        """Copies the adapter's current values into what the agent reads (before each step)."""
        now = self._current()
        self._mirror.refresh(lambda n: now[n].detach())

    def close(self):
        self._mirror.close()


# ---- inference side --------------------------------------------------------------------------

class VllmAdapterLoader:
    """Loads a PEFT directory into a vLLM ``LLM`` (or LLMEngine) through vLLM's own LoRA path,
    ``add_lora``; vLLM validates the config against its LoRA settings (max_lora_rank, the
    model's supported modules) and reads the weights before it evicts anything."""

    def __init__(self, llm):
        self.engine = getattr(llm, "llm_engine", llm)

    def load(self, name, int_id, path):
        from vllm.lora.request import LoRARequest
        request = LoRARequest(name, int_id, path)
        if not self.engine.add_lora(request):
            raise WeightbeamError(f"vLLM did not load adapter {name} (id {int_id}) from {path}",
                                  "INTERNAL")
        return request

    def unload(self, request):
        self.engine.remove_lora(request.lora_int_id)


class AdapterSlot:
    """The engine's adapter slot, fed by weightbeam. ``session``: an inference LocalSession of
    its own (the slot watches it) on an agent with ``receive.mode: staged``; ``specs``: name ->
    (shape, dtype), e.g. ``adapter_specs``; ``loader``: ``load(name, int_id, path)`` returning
    the engine's handle or raising, ``unload(handle)``.

    ``active`` is the handle to serve with (None before the first version), ``version`` its
    version, ``error`` the last failed load's reason. Engine calls go under ``lock``: the slot
    loads from its own thread. Version v is loaded as ``{name}-v{v}`` with id ``id_offset + v``;
    the version it replaced stays loaded (and on disk) until the next commit, so requests still
    holding it finish with it."""

    def __init__(self, session, specs, peft_config, loader, workdir, name="adapter",
                 check=False, id_offset=0):
        self.name, self.loader, self.workdir = name, loader, workdir
        self.peft_config, self.id_offset, self.check = config_dict(peft_config), id_offset, check
        self.specs = {n: (tuple(s), to_dtype(d)) for n, (s, d) in specs.items()}
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self.active, self.version, self.error, self.failed = None, 0, "", 0
        self.load_seconds = 0.0  # the last successful write + engine load
        self._loaded = {}  # version -> handle: the active one, the one it replaced, pending
        self._closed = False
        os.makedirs(workdir, exist_ok=True)
        self._buffer, self.views = self._register(session)
        self.session = session
        if check:
            session.check_versions(self._check_version, watcher=f"lora {name} check")
        # Without a check the live destinations are read at commit(v); acknowledging begin(v+1)
        # only after that keeps the agent from writing v+1 into them meanwhile.
        session.watch(ack=not check, watcher=f"lora {name}")
        self._thread = threading.Thread(target=self._run, name=f"wb-lora-{name}", daemon=True)
        self._thread.start()

    def _register(self, session):
        sizes = {n: int(np.prod(s)) * itemsize(d) for n, (s, d) in self.specs.items()}
        buf = SharedBuffer(sum(_aligned(b) for b in sizes.values()), f"lora-{self.name}")
        views, offset = {}, 0
        for n, (shape, dtype) in self.specs.items():
            views[n] = buf.array(_SAFETENSORS[dtype][1], shape, offset)
            session.register(n, dtype, shape, buffer=views[n])
            offset += _aligned(sizes[n])
        return buf, views

    def wait(self, version, timeout=None):
        """Waits until ``version`` (or a later one) is active: True, or False after
        ``timeout`` seconds. Raises WeightbeamError (``error``) when it failed to load. A
        committed step returns before the slot has heard commit(v): wait for it here."""
        with self._changed:
            done = self._changed.wait_for(
                lambda: self.version >= version or self.failed >= version, timeout)
            if done and self.version < version:
                raise WeightbeamError(self.error, "ABORTED")
            return bool(done)

    # ---- events ----

    def _run(self):
        while not self._closed:
            try:
                e = self.session.next_event(timeout=0.5)
            except WeightbeamError as err:
                if not self._closed:
                    log.error("lora %s: the agent's event stream ended: %s", self.name, err)
                return
            if e is not None:
                self._on_event(e)

    def _on_event(self, e):
        if e.kind == "begin" and not self.check:
            self.session.ack(e.version)
        elif e.kind == "commit":
            self._commit(e.version)
        elif e.kind == "abort":
            self._drop(e.version)

    def _check_version(self, version, staged):
        """The user check (check=True): load the staged bytes before the commit; an exception
        refuses the version everywhere, naming the engine's error."""
        self._load(version, staged)

    def _commit(self, version):
        if not self.check:
            try:
                self._load(version, self.views)
            except WeightbeamError:  # logged by _fail; the previous adapter keeps serving
                return
        with self.lock:
            if version not in self._loaded:
                self._fail(version, "committed without a load (no check ran)")
                return
            previous, self.version = self.version, version
            self.active = self._loaded[version]
            # Older than the one replaced; a newer one a check may be loading already stays.
            for v in [v for v in self._loaded if v < previous]:
                self._drop(v)
            self._changed.notify_all()
        log.info("lora %s: version %d active", self.name, version)

    def _load(self, version, arrays):
        path = os.path.join(self.workdir, f"{self.name}-v{version}")
        start = time.monotonic()
        try:
            self._write(path, arrays)
            with self.lock:
                self._loaded[version] = self.loader.load(f"{self.name}-v{version}",
                                                         self.id_offset + version, path)
            self.load_seconds = time.monotonic() - start
        except Exception as err:
            shutil.rmtree(path, ignore_errors=True)
            self._fail(version, f"{type(err).__name__}: {err}")
            raise WeightbeamError(self.error, "ABORTED") from err

    def _fail(self, version, why):
        with self.lock:
            keeps = f"version {self.version}" if self.active is not None else "no adapter"
            self.error = (f"adapter '{self.name}' version {version} did not load ({why}); "
                          f"the engine keeps {keeps}")
            self.failed = version
            self._changed.notify_all()
        log.error("lora %s: %s", self.name, self.error)

    def _drop(self, version):
        with self.lock:
            handle = self._loaded.pop(version, None)
            if handle is not None:
                self.loader.unload(handle)
        shutil.rmtree(os.path.join(self.workdir, f"{self.name}-v{version}"), ignore_errors=True)

    def _write(self, path, arrays):
        """The PEFT directory, written beside its place and renamed: the engine never reads a
        half-written one."""
        missing = sorted(set(self.specs) - set(arrays))
        if missing:
            raise WeightbeamError(f"no staged bytes for {missing[:3]}", "DATA_LOSS")
        tmp = path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        write_safetensors(os.path.join(tmp, WEIGHTS_FILE),
                          {n: (arrays[n], d) for n, (_, d) in self.specs.items()})
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            f.write(self._config_text())
        shutil.rmtree(path, ignore_errors=True)
        os.rename(tmp, path)

    def _config_text(self):
        return json.dumps(self.peft_config, indent=1)

    def close(self):
        self._closed = True
        self._thread.join()
        self._buffer.close()


def write_safetensors(path, tensors):
    """``tensors``: name -> (NumPy array, weightbeam DType); the safetensors layout (an 8-byte
    header length, the JSON header, the raw bytes), written without torch."""
    header, offset = {}, 0
    for name, (a, dtype) in sorted(tensors.items()):
        n = a.nbytes
        header[name] = {"dtype": _SAFETENSORS[dtype][0], "shape": list(a.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, (a, _) in sorted(tensors.items()):
            f.write(np.ascontiguousarray(a).tobytes())


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
