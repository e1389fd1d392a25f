"""The worker side of the weightbeam vLLM backend: vLLM builds one per worker when the engine
runs with ``WeightTransferConfig(backend="weightbeam")``.

``init_transfer_engine`` connects to the node's agent, asks it for this rank's vLLM layout,
checks the layout against this vLLM's own loader (conformance.py), and registers the live
parameters that passed in place (CPU parameters are moved once into shared memory; CUDA
parameters go by IPC handle) and, for those that did not, staging tensors in checkpoint format.
It then watches the agent's events with ``ack``: the agent stages each version and swaps it into
the live tensors only once every worker has acknowledged ``begin(v)``, which a worker does only
inside ``update_weights`` (vLLM runs no forward pass meanwhile).

Per round: ``start_weight_update`` (nothing to prepare), ``update_weights({"version": v})``
(waits for commit(v); abort(v) or the deadline raises, and the engine keeps version v-1), then
``finish_weight_update`` (feeds the fallback tensors through ``model.load_weights`` under vLLM's
layerwise reload, which re-runs the post-load processing) and only then reports done.
"""

import json
import logging
import os
import time
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)

from weightbeam import engines
from weightbeam.errors import WeightbeamError
from weightbeam.local_session import LocalSession
from weightbeam.shared_buffer import SharedBuffer
from weightbeam.vllm_backend import conformance
from weightbeam.vllm_backend.torch_dtypes import NAME_OF, torch_dtype

log = logging.getLogger("weightbeam.vllm")

DEFAULT_SOCKET = "/run/weightbeam/agent.sock"
_ALIGN = 64


@dataclass
class WeightbeamInitInfo(WeightTransferInitInfo):
    """What the trainer's sender passes to ``init_weight_transfer_engine`` (JSON-safe)."""
    agent_socket: str = DEFAULT_SOCKET
    replica: int = 0
    # The model's config.json; default: the one in the served model's directory.
    config: str = ""
    # Where each worker writes its conformance table (JSON) and Prometheus text; "" = not.
    report_dir: str = ""
    # Test only: make the layout wrong on purpose ("swap_kv", "swap_qk_norm") to show the
    # check catches it.
    test_wrong_layout: str = ""


@dataclass
class WeightbeamUpdateInfo(WeightTransferUpdateInfo):
    version: int = 0
    timeout_s: float = 300.0


class WeightbeamWeightTransferEngine(WeightTransferEngine):
    init_info_cls = WeightbeamInitInfo
    update_info_cls = WeightbeamUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.session = None
        self.rows = []
        self.fallback = {}  # checkpoint name -> staging tensor fed to load_weights
        self.version = 0  # the version the engine serves (0: its own checkpoint)
        self._received = None
        self.digest = ""  # the served version's digest (plans made with digest=True)
        self._received_digest = ""
        self.replica, self.rank, self.report_dir = 0, 0, ""
        self._buffers = []
        self._sharers = []
        self._rekernel = []  # fallback modules whose kernel is rebuilt as at first load
        self._reprocess = []
        self._views = {}
        self._inits = 0

    # ---- init ----------------------------------------------------------------------------

    def init_transfer_engine(self, info):
        # Again (a trainer that restarted): the old registrations go with the old session; the
        # old buffers are closed once the parameters have moved out of them.
        old_buffers, self._buffers = self._buffers, []
        if self.session is not None:
            self.session.close()
            self.session = None
        self.fallback = {}
        tp, tp_rank, ep, ep_rank = _parallel_ranks(self.vllm_config)
        fp8 = (self.model_config.quantization or "") == "fp8"
        config = _config_json(self.model_config, info.config)
        self.session = LocalSession(info.agent_socket, "inference", rank=tp_rank,
                                    replica=int(info.replica))
        self.replica, self.rank, self.report_dir = int(info.replica), tp_rank, info.report_dir
        layout = engines.engine_layout(self.session, config, "vllm", tp, tp_rank, ep, ep_rank,
                                       fp8)
        if info.test_wrong_layout:
            _make_wrong(layout, info.test_wrong_layout)
        start = time.monotonic()
        self.rows = conformance.check(self.model, layout)
        check_s = time.monotonic() - start
        in_place = {r.param for r in self.rows if r.path != conformance.FALLBACK}
        self._reprocess = sorted({r.module for r in self.rows
                                  if r.path == conformance.REPROCESS})
        log.info("weightbeam conformance (replica %s, tp rank %d of %d, %.2f s):\n%s",
                 info.replica, tp_rank, tp, check_s, conformance.format_table(self.rows))
        moved_s, moved_bytes = self._register_in_place([p for p in layout if p.name in in_place])
        # What the processing derived (a MoE kernel) must see the tensors where they now live.
        _reprocess(self.model, self._reprocess, self._views)
        fallback = [p for p in layout if p.name not in in_place]
        self._register_fallback(fallback, fp8)
        holders = conformance.parameter_holders(self.model)
        self._sharers = sorted({s for r in self.rows if r.path == conformance.FALLBACK
                                for s in conformance.sharing_modules(self.model, r.module,
                                                                     holders)})
        self._rekernel = sorted({r.module for r in self.rows if r.path == conformance.FALLBACK
                                 and _has_kernel(self.model, r.module)})
        if moved_bytes:
            log.info("weightbeam: moved %d CPU parameter bytes into shared memory in %.3f s",
                     moved_bytes, moved_s)
        # One name per init: a re-init's watcher must not be taken for the old one's.
        self._inits += 1
        self.session.watch(ack=True, watcher=f"vllm replica {info.replica} tp {tp_rank} "
                                             f"pid {os.getpid()} init {self._inits}")
        if info.report_dir:
            self._write_report(info.report_dir, info.replica, tp_rank, check_s)
        for b in old_buffers:
            b.close()

    def conformance_table(self):
        """[(parameter, "in place" | "in place + reprocess" | "fallback", why)] of this
        worker."""
        return [(r.param, r.path, r.why) for r in self.rows]

    def _register_in_place(self, params):
        live = {p.name: conformance.live_tensor(self.model, p.name) for p in params}
        start = time.monotonic()
        host = [t for t in live.values() if not t.is_cuda]
        moved = sum(t.numel() * t.element_size() for t in host)
        if host:
            self._buffers.append(_move_into_shared_memory(host))
        self._views = {}
        for p in params:
            self._views[conformance.resolve(self.model, p.name)] = live[p.name].data
        parts = []
        for p in params:
            for part in p.parts:
                parts.append(dict(
                    name=part.source, dtype=NAME_OF[p.dtype], global_shape=list(part.source_shape),
                    shard=[(b.start, b.size) for b in part.box], buffer=live[p.name].data,
                    view=(list(p.shape), list(part.offset), p.name)))
        engines._register_all(self.session, parts)
        return time.monotonic() - start, moved

    def _register_fallback(self, params, fp8):
        sources = {}
        for p in params:
            if fp8 and p.dtype != engines.types_pb2.DTYPE_BF16:
                raise WeightbeamError(
                    f"weightbeam: FP8 parameter '{p.name}' did not pass the conformance check "
                    "and FP8 has no fallback path here", "FAILED_PRECONDITION")
            for part in p.parts:
                sources.setdefault(part.source, (list(part.source_shape), p.dtype))
        if not sources:
            return
        sizes = {n: _nbytes(s, d) for n, (s, d) in sources.items()}
        buf = SharedBuffer(sum(_aligned(b) for b in sizes.values()), "vllm-fallback")
        self._buffers.append(buf)
        offset, registrations = 0, []
        for name, (shape, dtype) in sources.items():
            t = torch.frombuffer(buf.memoryview(offset, sizes[name]),
                                 dtype=torch_dtype(dtype)).view(shape)
            self.fallback[name] = t
            registrations.append(dict(name=name, dtype=NAME_OF[dtype], global_shape=shape,
                                      buffer=t))
            offset += _aligned(sizes[name])
        engines._register_all(self.session, registrations)

    def _write_report(self, report_dir, replica, rank, check_s):
        os.makedirs(report_dir, exist_ok=True)
        stem = os.path.join(report_dir, f"conformance-replica{replica}-rank{rank}")
        with open(stem + ".json", "w") as f:
            json.dump({"replica": replica, "rank": rank, "check_seconds": check_s,
                       "rows": [r.__dict__ for r in self.rows]}, f, indent=1)
        counts = {conformance.IN_PLACE: 0, conformance.REPROCESS: 0, conformance.FALLBACK: 0}
        for r in self.rows:
            counts[r.path] += 1
        with open(stem + ".prom", "w") as f:  # node_exporter textfile-collector format
            f.write("# TYPE weightbeam_vllm_parameters gauge\n")
            for path, n in counts.items():
                f.write(f'weightbeam_vllm_parameters{{replica="{replica}",rank="{rank}",'
                        f'path="{path.replace(" + ", "_").replace(" ", "_")}"}} {n}\n')

    # ---- a round ---------------------------------------------------------------------------

    def start_weight_update(self):
        self._check_ready()
        self._received = None

    def receive_weights(self, update_info):
        """Acknowledges begin(v) (the engine is paused: vLLM runs this between forward passes)
        and returns once commit(v) is announced; abort(v) or the deadline raises."""
        self._check_ready()
        v = int(update_info.version)
        if v <= self.version:
            raise ValueError(f"weightbeam: version {v} is not newer than the served {self.version}")
        deadline = time.monotonic() + float(update_info.timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"weightbeam: version {v} was not committed within "
                                   f"{update_info.timeout_s} s; the engine keeps version "
                                   f"{self.version}")
            e = self.session.next_event(timeout=min(left, 1.0))
            if e is None or e.version != v:
                continue
            if e.kind == "begin":
                self.session.ack(v)
            elif e.kind == "abort":
                raise RuntimeError(f"weightbeam: version {v} was aborted ({e.reason}); the "
                                   f"engine keeps version {self.version}")
            elif e.kind == "commit":
                self._received = v
                self._received_digest = e.digests.get(self.replica, "")
                return

    def update_weights(self, update_info):
        # The base class would synchronize an accelerator; the agent's swap is complete when
        # commit(v) is announced, and a CPU engine has none.
        self.receive_weights(self.parse_update_info(update_info))

    def finish_weight_update(self):
        self._check_ready()
        if self._received is None:
            raise RuntimeError("weightbeam: finish_weight_update without a committed version")
        if self.fallback:
            start = time.monotonic()
            _reload_through_engine(self.model, self.model_config, self.fallback, self._sharers,
                                   self._rekernel)
            log.info("weightbeam: version %d: %d fallback tensors through load_weights in "
                     "%.3f s", self._received, len(self.fallback), time.monotonic() - start)
        if self._reprocess:
            _reprocess(self.model, self._reprocess, self._views)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.version, self._received = self._received, None
        self.digest = self._received_digest
        if self.report_dir:
            self._write_weight_info()

    def weight_info(self):
        """What this worker serves: {"replica", "version", "digest"} (the digest the controller
        reports for this replica in StepResult.replica_digests and wbctl status; "" unless the
        plan was made with digest=True)."""
        return {"replica": self.replica, "version": self.version, "digest": self.digest}

    def _write_weight_info(self):
        path = os.path.join(self.report_dir, f"weights-replica{self.replica}-rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.weight_info(), f)
        os.replace(path + ".tmp", path)  # a reader never sees half of it

    def shutdown(self):
        if self.session is not None:
            self.session.close()
            self.session = None
        for b in self._buffers:
            if isinstance(b, SharedBuffer):
                b.close()
        self._buffers.clear()

    def _check_ready(self):
        if self.session is None:
            raise RuntimeError("weightbeam: call init_weight_transfer_engine first")


def _reload_through_engine(model, model_config, tensors, sharers, rekernel=()):
    """The fallback path: vLLM's own layerwise reload (load_weights, then each reloaded
    module's post-load processing), then the processing of the modules that share a reloaded
    parameter without being reloaded themselves (a tied head: vLLM's reload processes a tied
    parameter through one of its holders only).

    The modules in ``rekernel`` are processed as at the engine's first load: on a weight
    update vLLM 0.32's fused-MoE processing copies the checkpoint-format experts over the
    kernel's prepacked ones (its CPU kernel prepacks only when it is built), which leaves the
    kernel computing with the wrong bytes (0.3 nats off a fresh load on the suite's model)."""
    from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                         initialize_layerwise_reload)
    with torch.no_grad():
        for path in rekernel:
            conformance.first_load(model.get_submodule(path).quant_method)
        initialize_layerwise_reload(model)
        model.load_weights(iter(list(tensors.items())))
        finalize_layerwise_reload(model, model_config)
        for path in sharers:
            module = model.get_submodule(path)
            module.quant_method.process_weights_after_loading(module)


def _has_kernel(model, module_path):
    """Whether the module's quant method keeps a fused-MoE kernel built at first load."""
    try:
        quant_method = getattr(model.get_submodule(module_path), "quant_method", None)
    except AttributeError:
        return False
    return getattr(quant_method, "moe_kernel", None) is not None


def _reprocess(model, module_paths, views):
    """Runs, as at first load, the post-load processing of modules written in place whose
    processing derives state from their bytes (conformance.REPROCESS). Processing may put new
    parameters in place; they are pointed back at the registered memory (``views``: (module
    path, attribute) -> tensor), bytes unchanged, so that the next version lands where the
    kernel reads."""
    with torch.no_grad():
        for path in module_paths:
            module = model.get_submodule(path)
            conformance.first_load(module.quant_method)
            module.quant_method.process_weights_after_loading(module)
            for (owner, attr), view in views.items():
                param = module._parameters.get(attr) if owner == path else None
                if param is not None and param.data_ptr() != view.data_ptr():
                    view.copy_(param.data)
                    param.data = view


def _parallel_ranks(vllm_config):
    from vllm.distributed import (get_tensor_model_parallel_rank,
                                  get_tensor_model_parallel_world_size)
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size > 1 or pc.data_parallel_size > 1:
        raise WeightbeamError(
            f"weightbeam: pipeline ({pc.pipeline_parallel_size}) and data "
            f"({pc.data_parallel_size}) parallel vLLM engines are not supported by this backend "
            "yet; run one engine per replica with tensor (and expert) parallelism",
            "FAILED_PRECONDITION")
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    if pc.enable_expert_parallel:
        return tp, rank, tp, rank  # ep = dp x tp with dp 1
    return tp, rank, 1, None


def _config_json(model_config, path):
    if not path:
        candidate = os.path.join(str(model_config.model), "config.json")
        if os.path.exists(candidate):
            path = candidate
    if path:
        with open(path) as f:
            return f.read()
    return json.dumps(model_config.hf_config.to_dict())


def _make_wrong(layout, how):
    """Test only: swap two sources inside the layout (k_proj / v_proj parts of qkv_proj, or the
    q_norm / k_norm parameters), as a wrong layout rule would."""
    pairs = {"swap_kv": ("k_proj.", "v_proj."), "swap_qk_norm": ("q_norm.", "k_norm.")}
    if how not in pairs:
        raise ValueError(f"test_wrong_layout: {how!r} is not one of {sorted(pairs)}")
    a, b = pairs[how]
    for p in layout:
        for part in p.parts:
            if a in part.source:
                part.source = part.source.replace(a, b)
            elif b in part.source:
                part.source = part.source.replace(b, a)


def _move_into_shared_memory(tensors):
    """One SharedBuffer for ``tensors``; each one's ``.data`` becomes a view of it (same values,
    same shape): the agent can then write them in place."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    buf = SharedBuffer(sum(_aligned(s) for s in sizes), "vllm")
    offset = 0
    for t, size in zip(tensors, sizes):
        view = torch.frombuffer(buf.memoryview(offset, size), dtype=t.dtype).view(t.shape)
        view.copy_(t.data)
        t.data = view
        offset += _aligned(size)
    return buf


def _nbytes(shape, dtype):
    n = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    for d in shape:
        n *= d
    return n


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
