"""Trainer dialects end to end, in real PyTorch through real daemons: random Hugging Face weights,
each trainer rank's tensors built from them by trainer_reference.py (Megatron-core's and
DTensor's own rules, independent of weightbeam's layout code) on SharedBuffers and registered
as they are (weightbeam.engines.register_megatron_params / register_dtensor_params, every
data-parallel copy too), then a plan and a step into vLLM / SGLang ranks, and every rank's
parameters compared bit for bit with engine_reference.py. Refusals (a config Megatron cannot
split, FP8 blocks a trainer's shards cut, a wrong shape, a layer of another stage, an expert of
another EP rank) must be one error naming the tensor, with nothing registered."""

import os
import unittest
import zlib

import torch

import engine_reference as ref
import test_engines as te
import trainer_reference as tref
import weightbeam
from cluster import Cluster, wait_until
from weightbeam import engines

TRAINER_NODE, INFERENCE_NODE = "trainer-node", "inference-node"

# (family, tp, pp, ep, etp, dp, stage layers or None, destinations or None for all). The
# default run keeps one or two destinations per layout (a few minutes on a loaded 2-core
# machine); WB_TRAINERS_FULL=1 runs every destination for every layout.
FULL = bool(os.environ.get("WB_TRAINERS_FULL"))
MEGATRON = [
    ("llama", 1, 1, 1, 1, 1, None, [("vllm", 1, 1, True)]),  # refused: 64-row k/v groups
    ("llama", 2, 2, 1, 1, 2, None, [("vllm", 2, 1, False)]),
    ("qwen3", 4, 1, 1, 1, 1, None, [("sglang", 2, 1, True)]),
    ("qwen3", 2, 2, 1, 1, 1, [[0], [1, 2]], [("vllm", 1, 1, True)]),  # uneven stages
    ("qwen3_moe", 2, 1, 2, 1, 1, None, [("vllm", 2, 1, False)]),
    ("qwen3_moe", 2, 2, 2, 2, 2, None, [("sglang", 2, 2, True), ("vllm", 1, 2, False)]),
    ("qwen3_moe", 1, 1, 2, 1, 2, None, [("vllm", 2, 1, False)]),
    ("deepseek_v3", 2, 1, 2, 2, 2, None, [("sglang", 2, 2, True)]),
    ("deepseek_v3", 4, 2, 4, 1, 1, None, [("vllm", 1, 2, False)]),
    ("deepseek_v3", 1, 2, 2, 1, 2, None, [("vllm", 2, 1, False)]),
]
# Destinations per trainer layout: (engine, tp, ep, fp8).
DESTINATIONS = [("vllm", 2, 1, False), ("sglang", 2, 1, True), ("vllm", 1, 1, True)]
MOE_DESTINATIONS = [("vllm", 2, 1, False), ("sglang", 2, 2, True), ("vllm", 1, 2, False)]

COLWISE = ["*q_proj.weight", "*k_proj.weight", "*v_proj.weight", "*gate_proj.weight",
           "*up_proj.weight", "*embed_tokens.weight", "*lm_head.weight"]
ROWWISE = ["*o_proj.weight", "*down_proj.weight"]
# (label, family, mesh, rules, fused experts, destinations or None for all)
DTENSOR = [
    ("fsdp2", "qwen3", [3], [("*", ["S(0)"])], False,
     [("vllm", 2, 1, False), ("vllm", 1, 1, True)]),  # FP8 refused: 342-row chunks
    ("hsdp", "llama", [2, 2], [("*", ["R", "S(0)"])], False, [("sglang", 2, 1, False)]),
    ("fsdp+tp", "llama", [2, 2],
     [(p, ["SS(0)", "S(0)"]) for p in COLWISE] + [(p, ["S(0)", "S(1)"]) for p in ROWWISE]
     + [("*", ["S(0)", "R"])], False, [("vllm", 2, 1, False)]),
    ("ep+fsdp v5", "qwen3_moe", [2, 2],
     [("*.experts.*", ["S(0)", "S(1)"]), ("*", ["R", "S(0)"])], True,
     [("sglang", 2, 2, True)]),
]


class TrainerRank:
    """One trainer rank: its tensors (from the reference) in one SharedBuffer."""

    def __init__(self, socket, rank, tensors):
        self.session = weightbeam.LocalSession(socket, "trainer", rank=rank)
        held = [(n, tuple(t.shape), t.dtype) for n, t in tensors.items() if t.numel()]
        self.buffer = weightbeam.SharedBuffer(te.nbytes_of(held), f"tr{rank}")
        self.tensors = te.tensors_in(self.buffer, held)
        for name in self.tensors:
            self.tensors[name].copy_(tensors[name])

    def close(self):
        self.session.close()
        self.tensors = None
        self.buffer.close()


def expert_ranks(tp, dp, ep, etp, tp_rank, dp_rank):
    """Megatron's expert ranks of a (tp_rank, dp_rank): the tp x dp ranks of a stage regrouped
    as etp (fastest), then ep, then expert data parallel."""
    i = dp_rank * tp + tp_rank
    return (i // etp) % ep, i % etp


class TrainerLayouts(unittest.TestCase):
    verified, refused = [], []

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(2)
        cls.cluster = Cluster([INFERENCE_NODE, TRAINER_NODE], trainer_ranks=1)
        cls.ctl = weightbeam.ControllerClient(cls.cluster.controller_address)
        cls.version = 0

    @classmethod
    def tearDownClass(cls):
        cls.ctl.close()
        cls.cluster.stop()
        print("\nverified (trainer -> engine tp ep dtype):")
        for row in cls.verified:
            print("  " + " ".join(map(str, row)))
        print("refused:")
        for row in cls.refused:
            print("  " + " | ".join(map(str, row)))

    def registered(self, agent):
        return sum(len(layout.tensors) for layout in self.ctl.list_tensors(agent))

    def hf(self, family):
        return ref.random_hf_weights(te.load_config(family),
                                     seed=zlib.crc32(family.encode()) % 1000)

    def run_trainers(self, label, family, hf, ranks, destinations):
        """``ranks``: (rank, tensors, register(session, tensors) -> parts). Registers them all,
        then plans and steps into each destination and checks every byte."""
        config = te.load_config(family)
        trainers, count = [], 0
        try:
            for rank, tensors, register in ranks:
                t = TrainerRank(self.cluster.sockets[TRAINER_NODE], rank, tensors)
                trainers.append(t)
                count += register(t.session, t.tensors)
            wait_until(lambda: self.registered(TRAINER_NODE) == count, 20, "trainer parts")
            for engine, tp, ep, fp8 in destinations:
                if ep > 1 and ref._family(config) not in ("moe", "deepseek"):
                    continue
                with self.subTest(trainer=label, engine=engine, tp=tp, ep=ep, fp8=fp8):
                    self.run_engine(label, family, config, hf, len(trainers), engine, tp, ep, fp8)
        finally:
            for t in trainers:
                t.close()
            wait_until(lambda: self.registered(TRAINER_NODE) == 0, 20, "trainers withdrawn")

    def run_engine(self, label, family, config, hf, n_trainers, engine, tp, ep, fp8):
        what = (label, engine, tp, ep, "fp8" if fp8 else "bf16")
        if fp8 and tp not in ref.fp8_engine_valid_tps(config):
            return  # the engine side refuses it (test_engines covers that)
        replicas = ep // tp if engine == "vllm" and ep > tp else 1
        workers, count = [], 0
        try:
            for k in range(replicas):
                for r in range(tp):
                    ep_rank = k * tp + r if replicas > 1 else None
                    expected = ref.expected_engine_params(hf, config, engine, tp, r, ep, ep_rank,
                                                          fp8=fp8)
                    w = te.Worker(self.cluster.sockets[INFERENCE_NODE], expected, r, k)
                    w.expected = expected
                    workers.append(w)
                    count += engines.register_engine_params(
                        w.session, w.params, te.config_path(family), engine, tp, r, ep, ep_rank,
                        fp8)
            wait_until(lambda: self.registered(INFERENCE_NODE) == count, 20, "worker parts")
            try:
                self.ctl.plan(n_trainers, replicas, tp, wait_s=30)
            except weightbeam.WeightbeamError as e:
                # FP8 blocks that the trainer's shards cut (head_dim 64 groups, torch.chunk rows).
                self.assertTrue(fp8, f"{what}: unexpected refusal: {e}")
                self.assertIn("FP8 block scaling needs each 128x128 block from one source",
                              str(e))
                first = next((line for line in str(e).splitlines() if "FP8" in line), str(e))
                self.refused.append(what + (first.strip()[:400],))
                return
            TrainerLayouts.version += 1
            self.ctl.step(TrainerLayouts.version)
            for w in workers:
                te.EngineLayouts.assert_holds(self, w)
            self.verified.append(what)
        finally:
            for w in workers:
                w.close()
            wait_until(lambda: self.registered(INFERENCE_NODE) == 0, 20, "workers withdrawn")

    def megatron_case(self, family, tp, pp, ep, etp, dp, stages, destinations):
        label = f"megatron {family} tp{tp} pp{pp} ep{ep} etp{etp} dp{dp}" + \
            (" uneven" if stages else "")
        hf = self.hf(family)
        ranks = []
        for d in range(dp):
            for p in range(pp):
                layers = stages[p] if stages else None
                for t in range(tp):
                    e, x = expert_ranks(tp, dp, ep, etp, t, d)
                    tensors = tref.megatron_rank(hf, te.load_config(family), tp, t, pp, p, ep, e,
                                                 etp, x, layers)

                    def register(session, held, t=t, p=p, e=e, x=x, d=d, layers=layers):
                        return engines.register_megatron_params(
                            session, held, te.config_path(family), tp=tp, tp_rank=t, pp=pp,
                            pp_rank=p, ep=ep, ep_rank=e, etp=etp, etp_rank=x, dp=dp, dp_rank=d,
                            layers=layers)
                    ranks.append((len(ranks), tensors, register))
        self.run_trainers(label, family, hf, ranks, self.destinations(family, destinations))

    def destinations(self, family, chosen):
        if chosen and not FULL:
            return chosen
        moe = ref._family(te.load_config(family)) in ("moe", "deepseek")
        return MOE_DESTINATIONS if moe else DESTINATIONS

    def test_megatron(self):
        for case in MEGATRON:
            self.megatron_case(*case)

    def test_dtensor(self):
        for label, family, mesh, rules, fused, chosen in DTENSOR:
            hf = self.hf(family)
            config = te.load_config(family)
            full = tref.fused_experts(hf, config) if fused else hf
            ranks = []
            coords_list = [[]]
            for n in mesh:
                coords_list = [c + [i] for c in coords_list for i in range(n)]
            for coords in coords_list:
                local = tref.dtensor_local(full, mesh, coords, rules)

                def register(session, held, coords=coords):
                    return engines.register_dtensor_params(
                        session, held, te.config_path(family), mesh, coords, rules, fused)
                ranks.append((len(ranks), local, register))
            self.run_trainers(f"dtensor {label} {family} mesh {mesh}", family, hf, ranks,
                              self.destinations(family, chosen))

    def test_megatron_bf16_expert_bias_is_cast_by_the_agent(self):
        # Megatron-LM keeps router.expert_bias in BF16 until the first forward pass; the
        # engines keep e_score_correction_bias in f32. Values a BF16 can hold, so the f32 the
        # engine gets is exact.
        family = "deepseek_v3"
        config = te.load_config(family)
        hf = self.hf(family)
        for name in [n for n in hf if n.endswith("e_score_correction_bias")]:
            hf[name] = hf[name].to(torch.bfloat16).to(torch.float32)
        tensors = tref.megatron_rank(hf, config)
        biases = [n for n in tensors if n.endswith("router.expert_bias")]
        self.assertTrue(biases)
        for name in biases:
            tensors[name] = tensors[name].to(torch.bfloat16)

        def register(session, held):
            return engines.register_megatron_params(session, held, te.config_path(family))
        self.run_trainers("megatron deepseek_v3 bf16 expert_bias", family, hf,
                          [(0, tensors, register)], [("vllm", 1, 1, False)])

    def test_megatron_settings_the_model_cannot_split_are_refused(self):
        session = weightbeam.LocalSession(self.cluster.sockets[TRAINER_NODE], "trainer", rank=0)
        try:
            for family, tp, ep, etp, want in [
                    ("llama", 4, 1, 1, "tp 4 does not divide num_query_groups 2"),
                    ("qwen2", 2, 1, 1, "tp 2 does not divide num_query_groups 1"),
                    ("qwen3_moe", 1, 3, 1, "ep 3 does not divide the 8 experts"),
                    ("qwen3_moe", 1, 1, 3, "etp 3 does not divide moe_intermediate_size 1024")]:
                with self.assertRaises(weightbeam.WeightbeamError) as e:
                    engines.register_megatron_params(session, {}, te.config_path(family), tp=tp,
                                                     ep=ep, etp=etp)
                self.assertIn(want, str(e.exception))
                self.refused.append((f"megatron {family} tp{tp} ep{ep} etp{etp}",
                                     str(e.exception)))
        finally:
            session.close()

    def test_wrong_tensors_are_one_error_naming_them_and_nothing_is_registered(self):
        family = "qwen3_moe"
        config = te.load_config(family)
        hf = self.hf(family)
        # pp rank 1 of 2 (layer 1 as local 0), ep rank 1 of 2 (experts 4..7 as local 0..3).
        good = tref.megatron_rank(hf, config, 2, 0, 2, 1, 2, 1)
        rank = TrainerRank(self.cluster.sockets[TRAINER_NODE], 0, good)
        args = dict(tp=2, tp_rank=0, pp=2, pp_rank=1, ep=2, ep_rank=1)
        path = te.config_path(family)
        try:
            qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
            wrong = dict(rank.tensors)
            wrong[qkv] = wrong[qkv][:-1]
            cases = [
                (wrong, f"trainer tensor '{qkv}': shape [767, 256] does not match the config's "
                        "[768, 256]"),
                (dict(rank.tensors, **{"decoder.layers.1.mlp.router.weight":
                                       rank.tensors["decoder.layers.0.mlp.router.weight"]}),
                 "trainer tensor 'decoder.layers.1.mlp.router.weight' (megatron tp 0/2 pp 1/2 "
                 "ep 1/2 etp 0/1): layer 1 of another stage: pp rank 1 holds 1 layer(s), "
                 "numbered from 0"),
                (dict(rank.tensors, **{"decoder.layers.0.mlp.experts.linear_fc1.weight4":
                                       rank.tensors["decoder.layers.0.mlp.experts.linear_fc1."
                                                    "weight0"]}),
                 "trainer tensor 'decoder.layers.0.mlp.experts.linear_fc1.weight4' (megatron tp "
                 "0/2 pp 1/2 ep 1/2 etp 0/1): an expert of another EP rank: ep rank 1 does not "
                 "hold it"),
            ]
            for named, want in cases:
                with self.assertRaises(weightbeam.WeightbeamError) as e:
                    engines.register_megatron_params(rank.session, named, path, **args)
                self.assertEqual(str(e.exception), want)
                self.assertEqual(self.registered(TRAINER_NODE), 0)
                self.refused.append(("megatron wrong tensor", want))
            # Nothing half-registered: the right tensors register in the same session.
            self.assertGreater(engines.register_megatron_params(rank.session, rank.tensors, path,
                                                                **args), 0)
        finally:
            rank.close()
            wait_until(lambda: self.registered(TRAINER_NODE) == 0, 20, "trainer withdrawn")


if __name__ == "__main__":
    unittest.main()
