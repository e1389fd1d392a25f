"""One rank of a real torch 2.x trainer (gloo on CPU) for tests/trainers/suite.py: a tiny random
Qwen3 built by `transformers`, parallelised as the case says (FSDP2 ``fully_shard``, HSDP on a
2-D mesh, TP with ``parallelize_module`` under FSDP2), registered with the node agent straight
from the model (``engines.register_dtensor_params(session, model, config)``). Rank 0 also plays
the inference side: zeroed vLLM-layout buffers (BF16, then FP8) registered with the other
agent, plans, steps, and compares every engine parameter bit for bit with
engine_reference.py's layout of the model's own ``full_tensor()`` (gathered by DTensor; no
weightbeam layout code in the reference). Two versions: the model as built, then after one
AdamW step.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
    trainer.py --case fsdp2 --trainer-socket S --inference-socket S --controller ADDR --out F
"""

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import engine_reference as ref  # noqa: E402
import weightbeam  # noqa: E402
from weightbeam import engines  # noqa: E402


def qwen3(hidden, heads, kv_heads, intermediate, tied):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": 2,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 128,
            # 1001 rows: no world here divides it, so torch.chunk's pieces are uneven.
            "vocab_size": 1001, "tie_word_embeddings": tied, "attention_bias": False,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 128}


# Each config is FP8 block-aligned for its trainer layout and destination: every torch.chunk
# row boundary of every FP8-quantised weight falls on a multiple of 128.
# name: (world, config, vLLM tp of the destinations)
CASES = {
    "fsdp2": (3, qwen3(384, 12, 6, 768, True), 2),
    "hsdp": (4, qwen3(256, 4, 2, 512, False), 2),
    "fsdp+tp": (4, qwen3(512, 8, 4, 1024, False), 1),
}


def parallelize(case, model, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if case == "fsdp2":
        mesh = init_device_mesh("cpu", (world,))
    elif case == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        mesh2 = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel()}
        for layer in model.model.layers:
            parallelize_module(layer, mesh2["tp"], plan)
        mesh = mesh2["dp"]
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return mesh


def full_tensors(model):
    """Every parameter gathered by DTensor itself (a collective: every rank calls it)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        out[name] = t.detach().clone()
    return out


def placements_seen(model):
    seen = {}
    for name, p in model.named_parameters():
        key = str(tuple(p.placements)) if hasattr(p, "placements") else "plain"
        seen.setdefault(key, name)
    return seen


def same_bits(a, b):
    if a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    elif a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return a.shape == b.shape and torch.equal(a, b)


class InferenceSide:
    """Rank 0's engine workers: one replica of ``tp`` vLLM ranks (BF16 or FP8), every parameter
    zeroed in a SharedBuffer and registered by register_engine_params. (A plan takes one layout
    per tensor name, so the BF16 and FP8 destinations are planned one after the other.)"""

    def __init__(self, socket, config, hf, tp, fp8):
        self.workers = []
        self.count = 0
        for r in range(tp):
            shapes = ref.expected_engine_params(hf, config, "vllm", tp, r, fp8=fp8)
            session = weightbeam.LocalSession(socket, "inference", rank=r, replica=0)
            held = [(n, tuple(t.shape), t.dtype) for n, t in shapes.items()]
            sizes = [-(-t.numel() * t.element_size() // 64) * 64 for t in shapes.values()]
            buf = weightbeam.SharedBuffer(max(64, sum(sizes)), f"tw-{r}")
            torch.frombuffer(buf.memoryview(), dtype=torch.uint8).zero_()
            params, offset = {}, 0
            for (name, shape, dtype), size in zip(held, sizes):
                n = shapes[name].numel() * shapes[name].element_size()
                params[name] = torch.frombuffer(buf.memoryview(offset, n),
                                                dtype=dtype).view(shape)
                offset += size
            self.count += engines.register_engine_params(session, params, config, "vllm",
                                                         tp, r, fp8=fp8)
            self.workers.append(dict(session=session, buffer=buf, params=params, fp8=fp8,
                                     rank=r))

    def check(self, hf, config, tp):
        """Problems (empty: every byte equals the reference); the bytes received."""
        problems, got = [], {}
        for w in self.workers:
            want = ref.expected_engine_params(hf, config, "vllm", tp, w["rank"], fp8=w["fp8"])
            for name, t in want.items():
                key = (w["fp8"], w["rank"], name)
                got[key] = w["params"][name].clone()
                if not same_bits(w["params"][name], t):
                    problems.append(f"{'fp8' if w['fp8'] else 'bf16'} tp rank {w['rank']} "
                                    f"'{name}': bytes differ from the reference")
        return problems, got

    def close(self):
        for w in self.workers:
            w["session"].close()
            w["buffer"].close()


def refusals(model, config):
    """What DTensorParams must refuse, each one WeightbeamError naming the parameter."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard
    from weightbeam.dtensor_params import DTensorParams
    out = []
    flat = init_device_mesh("cpu", (dist.get_world_size(),))  # collective: every rank
    named = dict(model.named_parameters())
    norm = "model.norm.weight"
    local = named[norm].to_local().detach().clone()
    down = "model.layers.0.mlp.down_proj.weight"
    cases = [
        ("a parameter on an unrelated mesh", dict(named, **{norm: DTensor.from_local(
            local, flat, [Shard(0)], run_check=False)}), f"parameter '{norm}': on device mesh"),
        ("a Partial placement", dict(named, **{down: DTensor.from_local(
            named[down].to_local().detach().clone(), named[down].device_mesh,
            [Partial(), Partial()], run_check=False)}),
         f"parameter '{down}': DTensor placement Partial"),
    ]
    for what, given, want in cases:
        try:
            DTensorParams(given, config)
            out.append(dict(what=what, error=None, ok=False))
        except weightbeam.WeightbeamError as e:
            out.append(dict(what=what, error=str(e), ok=want in str(e)))
    return out


def run(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    want_world, config, tp = CASES[args.case]
    assert world == want_world, (world, want_world)
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)  # the same initial weights on every rank
    model = Qwen3ForCausalLM(Qwen3Config(**config)).to(torch.bfloat16)
    parallelize(args.case, model, world)
    result = dict(case=args.case, world=world, tp=tp, torch=torch.__version__,
                  placements=placements_seen(model), versions=[], problems=[])

    session = weightbeam.LocalSession(args.trainer_socket, "trainer", rank=rank)
    start = time.monotonic()
    params = engines.register_dtensor_params(session, model, config)
    result["register_s"] = time.monotonic() - start
    result["mesh"], result["parts"] = params.mesh, params.parts
    parts = [None] * world
    dist.all_gather_object(parts, params.parts)
    result["parts_per_rank"] = parts
    if args.case == "fsdp+tp":
        result["refusals"] = refusals(model, config)

    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randint(0, config["vocab_size"], (2, 16),
                          generator=torch.Generator().manual_seed(7))
    ctl, previous, step = None, {}, 0
    error = None
    try:
        for version in (1, 2):
            if version == 2:  # a real optimizer step changes the weights
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                optim.step()
                optim.zero_grad()
            hf = full_tensors(model)  # the reference: every rank takes part in the gathers
            params.copy_shards()
            dist.barrier()
            if rank == 0 and error is None:
                try:
                    if ctl is None:
                        ctl = weightbeam.ControllerClient(args.controller)
                        wait_for(lambda: registered(ctl, "trainer-node") == sum(parts), 30)
                    for fp8 in (False, True):
                        step += 1
                        row, got = push(ctl, args, config, hf, tp, world, fp8, step)
                        row["version"] = version
                        key = "fp8" if fp8 else "bf16"
                        if version == 2:
                            row["changed"] = sum(not same_bits(got[k], previous[key][k])
                                                 for k in got)
                            if row["changed"] == 0:
                                row["problems"].append("version 2's bytes equal version 1's")
                        previous[key] = got
                        result["versions"].append(row)
                        result["problems"] += row["problems"]
                except Exception as e:
                    error = f"{type(e).__name__}: {e}"
                    result["problems"].append(error)
                    traceback.print_exc()
            dist.barrier()
    finally:
        if ctl is not None:
            ctl.close()
        session.close()
        params.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def push(ctl, args, config, hf, tp, world, fp8, step):
    """Registers the destination, plans, steps, checks every byte, withdraws it."""
    inference = InferenceSide(args.inference_socket, config, hf, tp, fp8)
    try:
        wait_for(lambda: registered(ctl, "inference-node") == inference.count, 30)
        ctl.plan(world, 1, tp, wait_s=30)
        t0 = time.monotonic()
        ctl.step(step, timeout_s=60)
        step_s = time.monotonic() - t0
        problems, got = inference.check(hf, config, tp)
    finally:
        inference.close()
    wait_for(lambda: registered(ctl, "inference-node") == 0, 30)
    return dict(dtype="fp8" if fp8 else "bf16", step_s=step_s, params=len(got), changed=None,
                problems=problems[:10]), got


def registered(ctl, agent):
    return sum(len(layout.tensors) for layout in ctl.list_tensors(agent))


def wait_for(cond, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"registrations not seen by the controller within {timeout_s} s")
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--trainer-socket", required=True)
    ap.add_argument("--inference-socket", required=True)
    ap.add_argument("--controller", required=True)
    ap.add_argument("--out", required=True)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
