"""Engine layouts end to end, in real PyTorch through real daemons: random Hugging Face weights
on two FSDP trainer ranks (weightbeam.engines.register_hf_shards), one inference worker session
per engine rank holding its parameters in torch tensors on SharedBuffers
(weightbeam.engines.register_engine_params), a plan and a step, then every rank's parameters
compared bit for bit with engine_reference.py (an independent re-implementation of the
engines' loaders and of the FP8 quantiser) for every family x engine x tp in {1, 2, 4, 8}
x ep in {1, 2} (MoE) x BF16 / FP8. FP8 layouts that cut a 128x128 block must be refused naming
the parameter. One cluster serves every combination (workers re-register per combination)."""

import json
import os
import unittest
import zlib

import torch

import engine_reference as ref
import weightbeam
from cluster import Cluster, wait_until
from weightbeam import engines

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
TRAINERS = 2
ALIGN = 128  # trainer shards on 128-row boundaries, so FP8 blocks never span two trainers
SENTINEL = 0x55  # every destination byte before the step; vocab padding must keep it
TRAINER_NODE, INFERENCE_NODE = "trainer-node", "inference-node"


def config_path(family):
    return os.path.join(HERE, "engine_configs", family + ".json")


def load_config(family):
    with open(config_path(family)) as f:
        return json.load(f)


def combos(config, engine):
    """(tp, ep) pairs: tp 1..8; MoE: vLLM ep = dp * tp (dp 2 at tp 1, dp 1 at tp 2), SGLang ep 2
    dividing tp."""
    out = [(tp, 1) for tp in (1, 2, 4, 8)]
    if ref._family(config) in ("moe", "deepseek"):
        out += [(1, 2), (2, 2)] if engine == "vllm" else [(2, 2), (4, 2), (8, 2)]
    return out


def chunk_rows(rows):
    per = -(-rows // TRAINERS)
    return -(-per // ALIGN) * ALIGN


def fsdp_first_ranks(order, hf):
    """Aligned shards: each tensor's first chunk sits on the rank after the previous tensor's
    last chunk, in the order the agent lists the tensors."""
    first, at = {}, 0
    for name in order:
        first[name] = at
        rows = hf[name].shape[0]
        at = (at + -(-rows // chunk_rows(rows))) % TRAINERS
    return first


def fsdp_rows(rows, rank, first_rank):
    chunk = (rank - first_rank) % TRAINERS
    start = min(chunk * chunk_rows(rows), rows)
    return start, min(chunk_rows(rows), rows - start)


def tensors_in(buffer, shapes):
    """torch tensors of (name, shape, dtype) laid out one after another (64-byte aligned)."""
    out, offset = {}, 0
    for name, shape, dtype in shapes:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        n = itemsize
        for d in shape:
            n *= d
        if n:
            out[name] = torch.frombuffer(buffer.memoryview(offset, n), dtype=dtype).view(shape)
        else:
            out[name] = torch.empty(shape, dtype=dtype)
        offset += -(-n // 64) * 64
    return out


def nbytes_of(shapes):
    total = 0
    for _, shape, dtype in shapes:
        n = torch.empty(0, dtype=dtype).element_size()
        for d in shape:
            n *= d
        total += -(-n // 64) * 64
    return max(total, 64)


class Trainer:
    def __init__(self, socket, rank, hf, family):
        self.session = weightbeam.LocalSession(socket, "trainer", rank=rank)
        order = [t.name for t in engines.source_layout(self.session, config_path(family), rank,
                                                       TRAINERS, ALIGN)]
        assert sorted(order) == sorted(hf), "the agent lists other tensors than the reference"
        first = fsdp_first_ranks(order, hf)
        shards = []
        for name, t in hf.items():
            start, size = fsdp_rows(t.shape[0], rank, first[name])
            if size:
                shards.append((name, (size,) + tuple(t.shape[1:]), t.dtype, start))
        self.buffer = weightbeam.SharedBuffer(nbytes_of([s[:3] for s in shards]), f"t{rank}")
        self.shards = tensors_in(self.buffer, [s[:3] for s in shards])
        for name, shape, _, start in shards:
            self.shards[name].copy_(hf[name][start:start + shape[0]])
        self.count = engines.register_hf_shards(self.session, self.shards,
                                                config_path(family), rank, TRAINERS, ALIGN)

    def close(self):
        self.session.close()
        self.shards = None
        self.buffer.close()


class Worker:
    """One engine rank: its parameters (shapes and dtypes from the reference) in one
    SharedBuffer, every byte SENTINEL before the step."""

    def __init__(self, socket, expected, rank, replica):
        self.session = weightbeam.LocalSession(socket, "inference", rank=rank, replica=replica)
        shapes = [(n, tuple(t.shape), t.dtype) for n, t in expected.items()]
        self.buffer = weightbeam.SharedBuffer(nbytes_of(shapes), f"w{replica}-{rank}")
        torch.frombuffer(self.buffer.memoryview(), dtype=torch.uint8).fill_(SENTINEL)
        self.params = tensors_in(self.buffer, shapes)

    def close(self):
        self.session.close()
        self.params = None
        self.buffer.close()


def same_bits(a, b):
    if a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    elif a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return a.shape == b.shape and torch.equal(a, b)


class EngineLayouts(unittest.TestCase):
    verified, refused = [], []

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(2)
        cls.cluster = Cluster([INFERENCE_NODE, TRAINER_NODE], trainer_ranks=TRAINERS)
        cls.ctl = weightbeam.ControllerClient(cls.cluster.controller_address)
        cls.version = 0

    @classmethod
    def tearDownClass(cls):
        cls.ctl.close()
        cls.cluster.stop()
        print("\nverified (family engine tp ep dtype):")
        for row in cls.verified:
            print("  " + " ".join(map(str, row)))
        print("refused:")
        for row in cls.refused:
            print("  " + " ".join(map(str, row)))

    def registered(self, agent):
        return sum(len(layout.tensors) for layout in self.ctl.list_tensors(agent))

    def run_family(self, family):
        config = load_config(family)
        hf = ref.random_hf_weights(config, seed=zlib.crc32(family.encode()) % 1000)
        trainers = [Trainer(self.cluster.sockets[TRAINER_NODE], r, hf, family)
                    for r in range(TRAINERS)]
        try:
            want = sum(t.count for t in trainers)
            wait_until(lambda: self.registered(TRAINER_NODE) == want, 20, "trainer shards")
            valid_fp8 = ref.fp8_engine_valid_tps(config)
            for engine in ref.ENGINES:
                for tp, ep in combos(config, engine):
                    for fp8 in (False, True):
                        with self.subTest(engine=engine, tp=tp, ep=ep, fp8=fp8):
                            self.run_combo(family, config, hf, engine, tp, ep, fp8,
                                           fp8 and tp not in valid_fp8)
        finally:
            for t in trainers:
                t.close()
            wait_until(lambda: self.registered(TRAINER_NODE) == 0, 20, "trainers withdrawn")

    def run_combo(self, family, config, hf, engine, tp, ep, fp8, expect_refusal):
        # vLLM EP beyond tp: ep / tp data-parallel replicas, each with tp ranks.
        replicas = ep // tp if engine == "vllm" and ep > tp else 1
        workers, count = [], 0
        try:
            for k in range(replicas):
                for r in range(tp):
                    ep_rank = k * tp + r if replicas > 1 else None
                    expected = ref.expected_engine_params(hf, config, engine, tp, r, ep, ep_rank,
                                                          fp8=fp8)
                    w = Worker(self.cluster.sockets[INFERENCE_NODE], expected, r, k)
                    w.expected = expected
                    workers.append(w)
                    try:
                        count += engines.register_engine_params(
                            w.session, w.params, config_path(family), engine, tp, r, ep, ep_rank,
                            fp8)
                    except weightbeam.WeightbeamError as e:
                        self.assertTrue(expect_refusal, f"unexpected refusal: {e}")
                        self.assertRegex(str(e), r"^engine parameter '[^']+': FP8 part .* cuts a "
                                                 r"128x128 block")
                        self.assertEqual(self.registered(INFERENCE_NODE), 0)  # nothing registered
                        self.refused.append((family, engine, tp, ep, "fp8", str(e).split("'")[1]))
                        return
            self.assertFalse(expect_refusal, "an FP8 layout that cuts blocks was accepted")
            wait_until(lambda: self.registered(INFERENCE_NODE) == count, 20, "worker parts")
            self.ctl.plan(TRAINERS, replicas, tp, wait_s=30)
            EngineLayouts.version += 1
            self.ctl.step(EngineLayouts.version)
            for w in workers:
                self.assert_holds(w)
            self.verified.append((family, engine, tp, ep, "fp8" if fp8 else "bf16"))
        finally:
            for w in workers:
                w.close()
            wait_until(lambda: self.registered(INFERENCE_NODE) == 0, 20, "workers withdrawn")

    def assert_holds(self, worker):
        for name, want in worker.expected.items():
            got = worker.params[name]
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                real = (want != 0).any(dim=1).nonzero()
                n = int(real[-1]) + 1 if real.numel() else 0
                pad = got[n:].contiguous().view(torch.uint8)
                self.assertTrue(bool((pad == SENTINEL).all()), f"{name}: padding rows written")
                got, want = got[:n], want[:n]
            self.assertTrue(same_bits(got, want), f"{name}: bytes differ from the reference")

    def test_llama(self):
        self.run_family("llama")

    def test_qwen2(self):
        self.run_family("qwen2")

    def test_qwen3(self):
        self.run_family("qwen3")

    def test_qwen3_moe(self):
        self.run_family("qwen3_moe")

    def test_deepseek_v3(self):
        self.run_family("deepseek_v3")

    def test_bad_input_is_one_error_naming_it_and_nothing_is_registered(self):
        config = load_config("llama")
        hf = ref.random_hf_weights(config, seed=1)
        expected = ref.expected_engine_params(hf, config, "vllm", 2, 0)
        w = Worker(self.cluster.sockets[INFERENCE_NODE], expected, 0, 0)
        try:
            gpt2 = dict(config, architectures=["GPT2LMHeadModel"])
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                engines.register_engine_params(w.session, w.params, gpt2, "vllm", 2, 0)
            self.assertIn("unknown architecture 'GPT2LMHeadModel'", str(e.exception))
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                engines.register_engine_params(w.session, w.params, config, "vllm", 3, 0)
            self.assertEqual(str(e.exception),
                             "tp 3 does not divide num_attention_heads 8 (model.layers.0.self_attn)")
            wrong = dict(w.params)
            name = "model.layers.1.mlp.down_proj.weight"
            wrong[name] = wrong[name].view(-1)[:256 * 128].view(128, 256)
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                engines.register_engine_params(w.session, wrong, config, "vllm", 2, 0)
            self.assertEqual(str(e.exception), f"engine parameter '{name}': shape [128, 256] "
                                               "does not match the config's [256, 256]")
            self.assertEqual(self.registered(INFERENCE_NODE), 0)
            # Nothing half-registered: the right tensors register in the same session.
            self.assertGreater(engines.register_engine_params(w.session, w.params, config,
                                                              "vllm", 2, 0), 0)
        finally:
            w.close()
            wait_until(lambda: self.registered(INFERENCE_NODE) == 0, 20, "worker withdrawn")


if __name__ == "__main__":
    unittest.main()
