"""A torch 2.x model's DTensor parameters registered as this rank holds them, read from the
objects themselves: each parameter's device mesh, placements (Shard, _StridedShard, Replicate),
global shape and local shard. Plain tensors count as replicated. Host shards are mirrored into
one SharedBuffer the agent maps (``copy_shards`` refreshes it before each push); CUDA shards are
registered in place.

    params = DTensorParams(model, "config.json")   # after fully_shard / parallelize_module
    params.register(session)
    ...                                            # each step: optimizer.step(), then
    params.copy_shards()                           # before the controller's step

``engines.register_dtensor_params(session, model, config)`` does the first two lines. The layout
rules themselves are the agent's (``TrainerLayout``, docs/trainers.md "DTensor"): this module
only turns the objects into the mesh / coordinates / placement rules that the hand-written form
(kept for torch 1.13, which has no DTensor) spells out. Torch-only: no vLLM here.
"""

import itertools

import torch

from weightbeam import engines
from weightbeam.errors import WeightbeamError
from weightbeam.host_mirror import HostMirror

# Transformers v5 keeps each MoE layer's experts stacked under these names.
FUSED_EXPERTS_SUFFIX = "mlp.experts.gate_up_proj"


class DTensorParams:
    """``model_or_named``: a module (its ``named_parameters()``), a dict name -> tensor or an
    iterable of (name, tensor); names are the Hugging Face ones (a ``transformers`` model's).
    Every DTensor must be on one device mesh, or on a sub-mesh of it (FSDP2 over TP leaves the
    parameters TP does not touch on the data-parallel sub-mesh): a parameter on an unrelated
    mesh, or with a placement weightbeam does not read (Partial), is one WeightbeamError naming
    it. ``fused_experts``: None detects the stacked experts by name."""

    def __init__(self, model_or_named, config, fused_experts=None):
        self.config = config
        self.named = _named_parameters(model_or_named)
        self.fused_experts = any(n.endswith(FUSED_EXPERTS_SUFFIX) for n in self.named) \
            if fused_experts is None else bool(fused_experts)
        self.mesh, self.coords, self.rules = _mesh_and_rules(self.named)
        self.session = None
        self.parts = 0  # parts registered by register()
        self._mirror = None

    def local(self, name):
        """This rank's local shard of parameter ``name`` (the tensor itself, not the mirror)."""
        return _local(self.named[name])

    def register(self, session):
        """Registers every non-empty local shard with ``session``'s agent; returns the number of
        parts registered. Nothing stays registered if the agent refuses one."""
        self._mirror = HostMirror({n: self.local(n) for n in self.named}, "trainer")
        try:
            self._mirror.refresh(self.local)
            named = {n: self._mirror.views.get(n, self.local(n)) for n in self.named
                     if self.local(n).numel() > 0}
            self.parts = engines.register_dtensor_params(
                session, named, self.config, self.mesh, self.coords, self.rules,
                fused_experts=self.fused_experts)
        except Exception:
            self._free_mirror()
            raise
        self.session = session
        return self.parts

    def copy_shards(self):
        """Call after each optimizer step, before the push: copies host shards into the
        registered memory (a local copy of this rank's own shard), then waits for CUDA writers
        (``session.sources_ready()``)."""
        if self._mirror is not None:
            self._mirror.refresh(self.local)
        if self.session is not None:
            self.session.sources_ready()

    def close(self):
        """Frees the mirror memory. Close the session first (the agent withdraws the tensors
        when it ends); this object no longer pushes after it."""
        self.session = None
        self._free_mirror()

    def _free_mirror(self):
        if self._mirror is not None:
            self._mirror, mirror = None, self._mirror
            mirror.close()


def _named_parameters(model_or_named):
    if hasattr(model_or_named, "named_parameters"):
        return dict(model_or_named.named_parameters())
    if isinstance(model_or_named, dict):
        return dict(model_or_named)
    return dict(model_or_named)


def _is_dtensor(p):
    return hasattr(p, "device_mesh") and hasattr(p, "placements") and hasattr(p, "to_local")


def _local(p):
    return p.to_local() if _is_dtensor(p) else p.data


def _mesh_and_rules(named):
    """(mesh shape, this rank's coordinates, [(name, placements)] + a replicated default) on
    the mesh with the most dimensions; parameters on a sub-mesh of it are replicated over the
    dimensions they lack."""
    dtensors = [(n, p) for n, p in named.items() if _is_dtensor(p)]
    if not dtensors:
        return [1], [0], [("*", "R")]
    mesh = max((p.device_mesh for _, p in dtensors), key=lambda m: m.ndim)
    coords = mesh.get_coordinate()
    if coords is None:
        raise WeightbeamError(f"this rank is not in the parameters' device mesh {mesh}",
                              "INVALID_ARGUMENT")
    shape = [int(s) for s in mesh.shape]
    rules = []
    for name, p in dtensors:
        dims = _dims_in(mesh, list(coords), p.device_mesh)
        if dims is None:
            raise WeightbeamError(
                f"parameter '{name}': on device mesh {p.device_mesh}, neither the mesh "
                f"{mesh} of the others nor a sub-mesh of it; weightbeam registers one mesh "
                "per rank", "INVALID_ARGUMENT")
        texts = ["R"] * len(shape)
        kinds = [None] * len(shape)
        for d, q in zip(dims, p.placements):
            texts[d], kinds[d] = _placement_text(name, q)
        _check_split_factors(name, p, dims, shape, kinds)
        rules.append((name, ",".join(texts)))
    return shape, [int(c) for c in coords], rules + [("*", ",".join("R" for _ in shape))]


def _dims_in(mesh, coords, sub):
    """Which dimensions of ``mesh`` (in ``sub``'s order) ``sub`` is the slice of through this
    rank, or None. By dimension names where both have them, else by the ranks they hold."""
    if sub is mesh or (sub.ndim == mesh.ndim and _ranks(sub) == _ranks(mesh)):
        return list(range(mesh.ndim))
    names, sub_names = mesh.mesh_dim_names, sub.mesh_dim_names
    if names and sub_names and all(n in names for n in sub_names):
        candidates = [[list(names).index(n) for n in sub_names]]
    else:
        candidates = [list(c) for c in itertools.permutations(range(mesh.ndim), sub.ndim)]
    ranks = torch.as_tensor(mesh.mesh)
    for dims in candidates:
        index = tuple(slice(None) if d in dims else coords[d] for d in range(mesh.ndim))
        held = ranks[index]  # the kept dims, ascending
        ascending = sorted(dims)
        held = held.permute([ascending.index(d) for d in dims]) if dims else held
        if held.tolist() == _ranks(sub):
            return dims
    return None


def _ranks(mesh):
    return torch.as_tensor(mesh.mesh).tolist()


def _placement_text(name, p):
    kind = type(p).__name__
    if kind == "Replicate":
        return "R", None
    if kind == "_StridedShard":
        return f"SS({p.dim})", ("SS", p.dim)
    if kind == "Shard":
        return f"S({p.dim})", ("S", p.dim)
    raise WeightbeamError(f"parameter '{name}': DTensor placement {p!r} is not one weightbeam "
                          "reads (Shard, _StridedShard, Replicate)", "INVALID_ARGUMENT")


def _check_split_factors(name, p, dims, shape, kinds):
    """weightbeam cuts a _StridedShard after the shards of the later mesh dimensions on the
    same tensor dimension (FSDP2 over TP): its split factor must be their product."""
    for d, q in zip(dims, p.placements):
        if kinds[d] is None or kinds[d][0] != "SS":
            continue
        want = 1
        for j in range(d + 1, len(shape)):
            if kinds[j] is not None and kinds[j][1] == q.dim:
                want *= shape[j]
        got = int(getattr(q, "split_factor", want))
        if got != want:
            raise WeightbeamError(
                f"parameter '{name}': {q!r} on mesh dimension {d} splits by {got}; weightbeam "
                f"reads a _StridedShard cut after the later mesh dimensions' {want} shard(s) "
                "of the same tensor dimension", "INVALID_ARGUMENT")

