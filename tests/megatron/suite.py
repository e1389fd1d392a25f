"""Real Megatron-core models through real daemons: per case, one process per rank (gloo)
initialises megatron.core.parallel_state, builds a GPTModel with the local layer spec on CPU
(use_cpu_initialization, BF16 through Float16Module as Megatron's bf16 training wraps it), and
registers it straight from the model (engines.register_megatron_params(session, model, config);
the "-vllm-source" case instead through the vLLM backend's MegatronShards, a real vLLM
WeightSource, called as WeightbeamTrainerWeightTransferEngine calls it).
Inference ranks register zeroed vLLM parameters (engines.register_engine_params); the controller
plans and steps. The reference: every rank saves the model with Megatron's own dist checkpoint
(model.sharded_state_dict()), this process reads it back whole (load_plain_tensors), converts
Megatron names to Hugging Face ones with the small explicit mapping below, and lays the engine
parameters out with tests/python/engine_reference.py (independent of weightbeam's layout
code). Two versions per destination, the second after a real torch.optim.AdamW step. Each case
prints "[wb] megatron <case> (<seconds> s): PASS|FAIL|SKIPPED (...)".

    suite.py [--cases dense-tp2-tied,...] [--keep]
"""

import argparse
import contextlib
import json
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback
import zlib

import torch
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import engine_reference as ref  # noqa: E402
import test_engines as te  # noqa: E402
import weightbeam  # noqa: E402
from cluster import Cluster, free_port, wait_until  # noqa: E402
from weightbeam import engines  # noqa: E402

TRAINER_NODE, INFERENCE_NODE = "trainer-node", "inference-node"
VERSIONS = 2
# Megatron builds a tied model with pp > 1 by moving the last stage's output_layer copy to CUDA
# (LanguageModule.setup_embeddings_and_output_layer: weight.data.cuda()), so on a CPU-only
# machine that case cannot be built; it runs where CUDA exists.
CPU_REFUSAL = "Found no NVIDIA driver on your system"

# name: (family, tie, tp, pp, ep, first stage layers or None, destinations (engine, tp, fp8))
CASES = {
    "dense-tp2-tied": ("qwen3", True, 2, 1, 1, None, [("vllm", 2, False), ("vllm", 1, True)]),
    "dense-tp2-untied": ("qwen3", False, 2, 1, 1, None, [("vllm", 1, False)]),
    "dense-pp2-uneven-untied": ("qwen3", False, 1, 2, 1, 1,
                                [("vllm", 2, False), ("vllm", 1, True)]),
    "dense-pp2-uneven-tied": ("qwen3", True, 1, 2, 1, 1, [("vllm", 2, False)]),
    "moe-ep2": ("qwen3_moe", False, 1, 1, 2, None, [("vllm", 2, False), ("vllm", 1, True)]),
    "moe-tp2-ep2": ("qwen3_moe", False, 2, 1, 2, None, [("vllm", 2, False)]),
    "dense-tp2-untied-vllm-source": ("qwen3", False, 2, 1, 1, None, [("vllm", 2, False)]),
}
# Cases whose ranks register through weightbeam.vllm_backend.MegatronShards (vLLM imported for
# real) rather than engines.register_megatron_params.
VLLM_SOURCE_CASES = {"dense-tp2-untied-vllm-source"}
DEFAULT_CASES = list(CASES)


def log(msg):
    print(f"[megatron-suite] {msg}", flush=True)


def padded_vocab(vocab, tp, divisible_by=128):
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


@contextlib.contextmanager
def cpu_checkpointing():
    """Megatron's dist-checkpoint save calls torch.cuda.synchronize() after its host copies and
    makes a status tensor on torch.cuda.current_device() (filesystem_async.preload_tensors,
    state_dict_saver.save_state_dict_async_finalize), CUDA or not: on CPU both stand in here."""
    sync, current = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize, torch.cuda.current_device = (lambda *a, **k: None), (lambda: "cpu")
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = sync, current


# ------------------------------------------------------------------------------------------
# One trainer rank (its own process)
# ------------------------------------------------------------------------------------------

def _seed(*parts):
    return zlib.crc32("|".join(map(str, parts)).encode())


def build_model(config, tie, tp, pp, ep, first_stage):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    moe = "num_experts" in config
    kw = dict(num_layers=config["num_hidden_layers"], hidden_size=config["hidden_size"],
              num_attention_heads=config["num_attention_heads"],
              num_query_groups=config["num_key_value_heads"], kv_channels=config["head_dim"],
              ffn_hidden_size=config["intermediate_size"], normalization="RMSNorm",
              layernorm_epsilon=config["rms_norm_eps"], gated_linear_unit=True,
              activation_func=torch.nn.functional.silu, add_bias_linear=False,
              qk_layernorm=True, use_cpu_initialization=True, params_dtype=torch.bfloat16,
              bf16=True, pipeline_dtype=torch.bfloat16, hidden_dropout=0.0,
              attention_dropout=0.0, tensor_model_parallel_size=tp,
              pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
              expert_tensor_parallel_size=1 if moe else None)
    if first_stage is not None:
        kw["num_layers_in_first_pipeline_stage"] = first_stage
    if moe:
        kw.update(num_moe_experts=config["num_experts"],
                  moe_router_topk=config["num_experts_per_tok"],
                  moe_ffn_hidden_size=config["moe_intermediate_size"], moe_grouped_gemm=False)
    cfg = TransformerConfig(**kw)
    spec = get_gpt_layer_local_spec(num_experts=config.get("num_experts"), qk_layernorm=True,
                                    normalization="RMSNorm")
    model = GPTModel(cfg, spec, vocab_size=padded_vocab(config["vocab_size"], tp),
                     max_sequence_length=256, pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=tie, position_embedding_type="rope")
    return Float16Module(cfg, model)


def distinct_values(model, ranks):
    """Megatron's CPU init draws every stage's and every EP rank's weights from the same seed
    (and norms start at 1): give each tensor of each shard its own values, the same on every
    data-parallel copy of it (seeded by name and the shard's model-parallel ranks)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            expert = ".experts." in name
            key = (name, ranks["pp_rank"], ranks["ep_rank"] if expert else "-",
                   ranks["etp_rank"] if expert else ranks["tp_rank"])
            g = torch.Generator().manual_seed(_seed("init", *key))
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + torch.randn(p.shape, generator=g) * 0.05)


def optimizer_step(model, ranks, optimizer):
    """One AdamW step on real gradients of a loss over every parameter (the GPTModel forward
    needs CUDA in Megatron's rotary embedding and linear layers, so the loss is on the weights)."""
    optimizer.zero_grad()
    loss = 0.0
    for name, p in model.named_parameters():
        expert = ".experts." in name
        key = (name, ranks["pp_rank"], ranks["ep_rank"] if expert else "-",
               ranks["etp_rank"] if expert else ranks["tp_rank"])
        g = torch.Generator().manual_seed(_seed("target", *key))
        target = torch.randn(p.shape, generator=g)
        loss = loss + ((p.float() - target) ** 2).sum()
    loss.backward()
    optimizer.step()


def rank_main(rank, world, case, config_path, socket, work, port, to_parent, go):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    held = None
    try:
        from megatron.core import dist_checkpointing
        from megatron.core import parallel_state as ps
        from weightbeam import megatron_params

        family, tie, tp, pp, ep, first_stage, _ = CASES[case]
        ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                     pipeline_model_parallel_size=pp,
                                     expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=1 if ep > 1 else None)
        with open(config_path) as f:
            config = json.load(f)
        torch.manual_seed(1234)
        model = build_model(config, tie, tp, pp, ep, first_stage)
        ranks = megatron_params.parallel_ranks()
        distinct_values(model, ranks)
        inner = megatron_params.unwrap(model)
        to_parent.put(("names", rank, dict(
            ranks, layers=megatron_params.stage_layers(inner),
            tensors=[(n, list(t.shape), str(t.dtype))
                     for n, t in megatron_params.model_tensors(inner).items()])))
        session = weightbeam.LocalSession(socket, "trainer", rank=rank)
        via_source = case in VLLM_SOURCE_CASES
        if via_source:
            held = vllm_source(rank, world, model, config_path, session)
        else:
            held = engines.register_megatron_params(session, model, config_path)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        for version in range(1, VERSIONS + 1):
            if version > 1:
                optimizer_step(model, ranks, optimizer)
            if version > 1 or via_source:  # send_weights copies before every round
                held.copy_shards()
            with cpu_checkpointing():
                dist_checkpointing.save(model.module.sharded_state_dict(),
                                        os.path.join(work, f"v{version}"))
            dist.barrier()
            to_parent.put(("ready", rank, version))
            if not go[version].wait(600):
                raise TimeoutError(f"rank {rank}: no go for version {version}")
    except Exception as e:
        to_parent.put(("error", rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        if held is not None:
            held.close()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def vllm_source(rank, world, model, config_path, session):
    """The vLLM backend's trainer side without a vLLM server: the source check of
    WeightbeamTrainerWeightTransferEngine.trainer_init (reached through vLLM's own factory; it
    refuses before it touches the client, so the client here is None), then MegatronShards
    registered as trainer_init registers it (``source.register(session)``); the caller calls
    ``copy_shards()`` as ``send_weights`` does and ``close()`` as ``shutdown`` does."""
    from vllm.distributed.weight_transfer.base import WeightSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    import weightbeam.vllm_backend as wbv
    from weightbeam.vllm_backend import trainer

    wbv.register()
    info = wbv.WeightbeamTrainerInitInfo(rank=rank, world=world)
    try:
        WeightTransferTrainerFactory.trainer_init(info, client=None, source=object())
        raise AssertionError("trainer_init took an object() source")
    except ValueError as e:
        if "DTensorShards" not in str(e) or "MegatronShards" not in str(e):
            raise AssertionError(f"trainer_init's refusal names neither class: {e}")
    source = wbv.MegatronShards(model, config_path)
    if not isinstance(source, WeightSource):
        raise AssertionError("MegatronShards is not a vLLM WeightSource")
    trainer.check_source(source)  # what trainer_init checks first
    meta = source.metadata()
    items = list(source)
    if [(m.name, m.dtype, tuple(m.shape)) for m in meta] != \
            [(n, t.dtype, tuple(t.shape)) for n, t in items] or not items:
        raise AssertionError("MegatronShards: metadata() and iteration disagree")
    source.register(session)
    return source


# ------------------------------------------------------------------------------------------
# The reference: Megatron's checkpoint, whole, under Hugging Face names
# ------------------------------------------------------------------------------------------

def load_full(path):
    """Every tensor of Megatron's dist checkpoint at ``path``, whole (this process is a
    one-rank gloo group: Megatron's loader asks for its rank)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
    return dist_checkpointing.load_plain_tensors(path)


def megatron_to_hf(full, config):
    """Megatron-core checkpoint tensors (layers stacked on dim 0, experts on dim 1, vocab
    padded, linear_qkv per query group [q heads; k; v], linear_fc1 = [gate; up]) as HF
    tensors."""
    V, H = config["vocab_size"], config["hidden_size"]
    nh, ng, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    hf = {"model.embed_tokens.weight": full["embedding.word_embeddings.weight"][:V],
          "model.norm.weight": full["decoder.final_layernorm.weight"]}
    if "output_layer.weight" in full and not config.get("tie_word_embeddings"):
        hf["lm_head.weight"] = full["output_layer.weight"][:V]
    layers = "decoder.layers."
    for i in range(config["num_hidden_layers"]):
        h, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."

        def m(name, i=i):
            return full[layers + name][i]
        hf[h + "input_layernorm.weight"] = m("self_attention.linear_qkv.layer_norm_weight")
        hf[h + "post_attention_layernorm.weight"] = m("mlp.linear_fc1.layer_norm_weight")
        qkv = m("self_attention.linear_qkv.weight").reshape(ng, nh // ng + 2, d, H)
        hf[a + "q_proj.weight"] = qkv[:, :nh // ng].reshape(nh * d, H)
        hf[a + "k_proj.weight"] = qkv[:, nh // ng].reshape(ng * d, H)
        hf[a + "v_proj.weight"] = qkv[:, nh // ng + 1].reshape(ng * d, H)
        hf[a + "q_norm.weight"] = m("self_attention.q_layernorm.weight")
        hf[a + "k_norm.weight"] = m("self_attention.k_layernorm.weight")
        hf[a + "o_proj.weight"] = m("self_attention.linear_proj.weight")
        if "num_experts" in config:
            hf[h + "mlp.gate.weight"] = m("mlp.router.weight")
            fc1, fc2 = m("mlp.experts.experts.linear_fc1.weight"), \
                m("mlp.experts.experts.linear_fc2.weight")
            inter = config["moe_intermediate_size"]
            for e in range(config["num_experts"]):
                x = f"{h}mlp.experts.{e}."
                hf[x + "gate_proj.weight"], hf[x + "up_proj.weight"] = fc1[e][:inter], \
                    fc1[e][inter:]
                hf[x + "down_proj.weight"] = fc2[e]
        else:
            fc1, inter = m("mlp.linear_fc1.weight"), config["intermediate_size"]
            hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"] = fc1[:inter], \
                fc1[inter:]
            hf[h + "mlp.down_proj.weight"] = m("mlp.linear_fc2.weight")
    return {k: v.contiguous() for k, v in hf.items()}


# ------------------------------------------------------------------------------------------
# One case
# ------------------------------------------------------------------------------------------

def registered(ctl, agent):
    return sum(len(layout.tensors) for layout in ctl.list_tensors(agent))


def check_destination(ctl, cluster, config, config_path, hf, engine, tp, fp8, world, version):
    workers, count = [], 0
    try:
        for r in range(tp):
            expected = ref.expected_engine_params(hf, config, engine, tp, r, fp8=fp8)
            w = te.Worker(cluster.sockets[INFERENCE_NODE], expected, r, 0)
            torch.frombuffer(w.buffer.memoryview(), dtype=torch.uint8).zero_()  # zeroed
            w.expected, w.rank = expected, r
            workers.append(w)
            count += engines.register_engine_params(w.session, w.params, config_path, engine,
                                                    tp, r, fp8=fp8)
        wait_until(lambda: registered(ctl, INFERENCE_NODE) == count, 20, "worker parts")
        ctl.plan(world, 1, tp, wait_s=60)
        ctl.step(version)
        bad = []
        for w in workers:
            for name, want in w.expected.items():
                # Whole tensors: vocab padding rows are zero in both.
                if not te.same_bits(w.params[name], want):
                    bad.append(f"{engine} tp{tp} rank {w.rank} {name}")
        return bad
    finally:
        for w in workers:
            w.close()
        wait_until(lambda: registered(ctl, INFERENCE_NODE) == 0, 20, "workers withdrawn")


def run_case(case, keep):
    family, tie, tp, pp, ep, first_stage, destinations = CASES[case]
    world = tp * pp * max(1, ep // tp) if ep > tp else tp * pp
    config = te.load_config(family)
    config["tie_word_embeddings"] = tie
    work = tempfile.mkdtemp(prefix=f"wb-megatron-{case}-", dir="/tmp")
    config_path = os.path.join(work, "config.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    for v in range(1, VERSIONS + 1):
        os.makedirs(os.path.join(work, f"v{v}"))
    cluster = Cluster([INFERENCE_NODE, TRAINER_NODE], trainer_ranks=world)
    ctl = weightbeam.ControllerClient(cluster.controller_address)
    ctx = mp.get_context("spawn")
    to_parent = ctx.Queue()
    go = {v: ctx.Event() for v in range(1, VERSIONS + 1)}
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, case, config_path,
                                                 cluster.sockets[TRAINER_NODE], work, port,
                                                 to_parent, go)) for r in range(world)]
    for p in procs:
        p.start()
    failures, names, step, previous = [], {}, 0, None
    try:
        for version in range(1, VERSIONS + 1):
            ready = 0
            while ready < world:
                try:
                    msg = to_parent.get(timeout=300)
                except queue.Empty:
                    raise TimeoutError(f"ranks not ready for version {version}")
                if msg[0] == "error":
                    if CPU_REFUSAL in msg[3]:
                        where = [line.strip() for line in msg[3].splitlines()
                                 if line.strip().startswith("File ")][-2:]
                        return "SKIPPED", f"Megatron cannot build it on CPU: {msg[2]} at " + \
                            " <- ".join(reversed(where))
                    raise RuntimeError(f"rank {msg[1]}: {msg[2]}\n{msg[3]}")
                if msg[0] == "names":
                    names[msg[1]] = msg[2]
                    continue
                ready += 1
            if version == 1:
                print_names(case, names)
            hf = megatron_to_hf(load_full(os.path.join(work, f"v{version}")), config)
            if previous is not None:  # the optimizer step moved every tensor
                same = [n for n in hf if torch.equal(hf[n], previous[n])]
                failures += [f"v{version}: {n} unchanged by the optimizer step" for n in same]
            previous = hf
            for engine, dtp, fp8 in destinations:
                step += 1
                bad = check_destination(ctl, cluster, config, config_path, hf, engine, dtp, fp8,
                                        world, step)
                what = f"v{version} {engine} tp{dtp} {'fp8' if fp8 else 'bf16'}"
                log(f"{case}: {what}: " + ("every byte equal" if not bad else
                                            f"{len(bad)} differ: {bad[:5]}"))
                failures += [f"{what}: {b}" for b in bad]
            go[version].set()
        return ("FAIL" if failures else "PASS"), "; ".join(failures[:5])
    finally:
        for v in go.values():
            v.set()
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
        ctl.close()
        cluster.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def print_names(case, names):
    """What the real model holds (rank 0's, and every rank's layers), for comparing with
    weightbeam's Megatron layout."""
    for rank in sorted(names):
        n = names[rank]
        log(f"{case}: rank {rank}: tp {n['tp_rank']}/{n['tp']} pp {n['pp_rank']}/{n['pp']} "
            f"ep {n['ep_rank']}/{n['ep']} etp {n['etp_rank']}/{n['etp']} dp {n['dp_rank']}/"
            f"{n['dp']} global layers {n['layers']}")
    if os.environ.get("WB_MEGATRON_NAMES"):
        for rank in sorted(names):
            for name, shape, dtype in names[rank]["tensors"]:
                log(f"{case}: rank {rank}:   {name} {shape} {dtype}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    failed = 0
    for case in args.cases.split(","):
        start = time.monotonic()
        try:
            outcome, detail = run_case(case, args.keep)
        except Exception as e:
            outcome, detail = "FAIL", f"{type(e).__name__}: {e}"
        took = time.monotonic() - start
        line = f"[wb] megatron {case} ({took:.0f} s): {outcome}"
        if outcome == "SKIPPED":
            line += f" ({detail})"
        print(line, flush=True)
        if outcome == "FAIL":
            print(f"[megatron-suite] {case}: {detail}", flush=True)
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
