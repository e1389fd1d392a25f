"""CONFIGS are block-aligned for FP8 up to tp 8 for qwen3, qwen3_moe and deepseek_v3; they
mirror tests/python/engine_configs/*.json.

Independent pure-torch model of how vLLM and SGLang lay out Hugging Face weights in their
inference parameters (the loader semantics weightbeam must reproduce), plus weightbeam's
BF16 -> FP8 e4m3fn 128x128 block quantiser.

The layout rules it implements are tabled in docs/engines.md. Written from the engines' loader
semantics (narrow / cat / stack / replicate / pad); no engine code is imported or copied.

Public API
  CONFIGS                                  small HF-style configs, one per family
  random_hf_weights(config, seed)          full HF-named BF16 tensors (+ f32 e_score_correction_bias)
  expected_engine_params(hf, config, engine, tp, tp_rank, ep=1, ep_rank=None, fp8=False,
                         sglang_fused_shared_experts=False)
                                           engine-named per-rank parameters
  quantize_fp8_block(x) / dequantize_fp8_block(codes, scales)
  mla_derived_buffers(params, config, tp)  W_UK_T / W_UV (vLLM) == w_kc / w_vc (SGLang) logical views

FP8 parameters are returned as torch.uint8 (e4m3fn bit patterns; torch 1.13 has no float8) and
their scales as float32 `<name>_scale_inv` (linear: `X.weight_scale_inv`; experts:
`w13_weight_scale_inv` / `w2_weight_scale_inv`), computed per 128x128 block of the DESTINATION
(fused, per-rank) tensor, ragged edge blocks included.

Run `python3 engine_reference.py` for the self-check.
"""

import json
import math
import os
import sys
import time
import zlib

import torch

BLOCK = 128
VOCAB_PAD = 64  # DEFAULT_VOCAB_PADDING_SIZE in both engines
ENGINES = ("vllm", "sglang")

# ------------------------------------------------------------------------------------------
# Example configs (also written to configs/*.json by `--write-configs`).
# ------------------------------------------------------------------------------------------

CONFIGS = {
    # kv heads 2 < 8: tp 4 and 8 replicate kv heads. head_dim explicit (64 != 256/8).
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 1000, "tie_word_embeddings": False, "attention_bias": False,
        "rms_norm_eps": 1e-5,
    },
    # MQA (1 kv head): every tp >= 2 replicates; q/k/v biases; tied; tiny vocab so that at
    # tp 8 (padded 192, 24 rows/rank) ranks 6 and 7 hold no real row at all.
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 1,
        "vocab_size": 130, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    },
    # Qwen3: head_dim 128 explicit, q_norm / k_norm, tied, kv 4 (tp 8 replicates x2).
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
        "vocab_size": 1000, "tie_word_embeddings": True, "attention_bias": False,
        "rms_norm_eps": 1e-6,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 1024,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 777, "tie_word_embeddings": False, "attention_bias": False,
        "rms_norm_eps": 1e-6,
    },
    # DeepSeek-V3 / Kimi-K2 shape family (MLA with q_lora_rank, noaux_tc router bias,
    # 1 shared expert, first_k_dense_replace 1). nope/rope/v = 128/64/128 like the real model.
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 256, "intermediate_size": 1024, "moe_intermediate_size": 1024,
        "num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_attention_heads": 16, "num_key_value_heads": 16,
        "q_lora_rank": 256, "kv_lora_rank": 256,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "vocab_size": 1000, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]},
    },
}


def _family(config):
    mt = config["model_type"]
    if mt in ("deepseek_v3", "deepseek_v2", "kimi_k2"):
        return "deepseek"
    if mt in ("qwen3_moe", "qwen2_moe"):
        return "moe"
    return "dense"


def _head_dim(config):
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _is_moe_layer(config, i):
    fam = _family(config)
    if fam == "deepseek":
        return (config.get("n_routed_experts") is not None
                and i >= config.get("first_k_dense_replace", 0)
                and i % config.get("moe_layer_freq", 1) == 0)
    if fam == "moe":
        step = config.get("decoder_sparse_step", 1)
        return (i not in config.get("mlp_only_layers", [])
                and config["num_experts"] > 0 and (i + 1) % step == 0)
    return False


def _num_experts(config):
    return config["n_routed_experts"] if _family(config) == "deepseek" else config["num_experts"]


# ------------------------------------------------------------------------------------------
# Random Hugging Face checkpoints
# ------------------------------------------------------------------------------------------

def random_hf_weights(config, seed=0):
    """Full, unsharded HF-named tensors: BF16, except e_score_correction_bias (float32)."""
    g = torch.Generator().manual_seed(seed)
    out = {}

    def mat(name, rows, cols, std=0.02):
        # Vary the magnitude per tensor so that FP8 scales differ between parts.
        s = std * float(torch.empty(1).uniform_(0.5, 4.0, generator=g))
        out[name] = (torch.randn(rows, cols, generator=g) * s).to(torch.bfloat16)

    def vec(name, n, base=1.0, std=0.1, dtype=torch.bfloat16):
        out[name] = (base + torch.randn(n, generator=g) * std).to(dtype)

    H, V = config["hidden_size"], config["vocab_size"]
    fam = _family(config)
    mat("model.embed_tokens.weight", V, H)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", H)
        vec(p + "post_attention_layernorm.weight", H)
        if fam == "deepseek":
            nh = config["num_attention_heads"]
            nope, rope, vd = (config["qk_nope_head_dim"], config["qk_rope_head_dim"],
                              config["v_head_dim"])
            ql, kvl = config.get("q_lora_rank"), config["kv_lora_rank"]
            if ql is not None:
                mat(p + "self_attn.q_a_proj.weight", ql, H)
                vec(p + "self_attn.q_a_layernorm.weight", ql)
                mat(p + "self_attn.q_b_proj.weight", nh * (nope + rope), ql)
            else:
                mat(p + "self_attn.q_proj.weight", nh * (nope + rope), H)
            mat(p + "self_attn.kv_a_proj_with_mqa.weight", kvl + rope, H)
            vec(p + "self_attn.kv_a_layernorm.weight", kvl)
            mat(p + "self_attn.kv_b_proj.weight", nh * (nope + vd), kvl)
            mat(p + "self_attn.o_proj.weight", H, nh * vd)
        else:
            D, nh, nkv = _head_dim(config), config["num_attention_heads"], config["num_key_value_heads"]
            mat(p + "self_attn.q_proj.weight", nh * D, H)
            mat(p + "self_attn.k_proj.weight", nkv * D, H)
            mat(p + "self_attn.v_proj.weight", nkv * D, H)
            mat(p + "self_attn.o_proj.weight", H, nh * D)
            if config["model_type"] == "qwen2" or config.get("attention_bias", False):
                for x, n in (("q", nh), ("k", nkv), ("v", nkv)):
                    vec(p + f"self_attn.{x}_proj.bias", n * D, base=0.0, std=0.05)
            if config["model_type"] in ("qwen3", "qwen3_moe"):
                vec(p + "self_attn.q_norm.weight", D)
                vec(p + "self_attn.k_norm.weight", D)
        if _is_moe_layer(config, i):
            E, Im = _num_experts(config), config["moe_intermediate_size"]
            mat(p + "mlp.gate.weight", E, H)
            if fam == "deepseek" and config.get("topk_method") == "noaux_tc":
                vec(p + "mlp.gate.e_score_correction_bias", E, base=0.0, std=0.01,
                    dtype=torch.float32)
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                mat(q + "gate_proj.weight", Im, H)
                mat(q + "up_proj.weight", Im, H)
                mat(q + "down_proj.weight", H, Im)
            if fam == "deepseek" and config.get("n_shared_experts"):
                Is = Im * config["n_shared_experts"]
                q = p + "mlp.shared_experts."
                mat(q + "gate_proj.weight", Is, H)
                mat(q + "up_proj.weight", Is, H)
                mat(q + "down_proj.weight", H, Is)
        else:
            I = config["intermediate_size"]
            mat(p + "mlp.gate_proj.weight", I, H)
            mat(p + "mlp.up_proj.weight", I, H)
            mat(p + "mlp.down_proj.weight", H, I)
    vec("model.norm.weight", H)
    if not config.get("tie_word_embeddings", False):
        mat("lm_head.weight", V, H)
    return out


# ------------------------------------------------------------------------------------------
# FP8 e4m3fn block quantiser (weightbeam semantics)
# ------------------------------------------------------------------------------------------

def _e4m3_values():
    """float64 magnitudes of the positive finite e4m3fn codes 0x00..0x7e (ascending)."""
    c = torch.arange(0x7f, dtype=torch.int64)
    e, m = c >> 3, (c & 7).to(torch.float64)
    return torch.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * torch.pow(2.0, (e - 7).to(torch.float64)))


_E4M3 = _e4m3_values()
_E4M3_F32 = _E4M3.to(torch.float32)  # every e4m3 value is exact in float32


def encode_e4m3(q):
    """float32 tensor -> uint8 e4m3fn codes: round to nearest, ties to even code, |x| >= 448
    (and +-Inf) saturate to 0x7e/0xfe, NaN -> 0x7f (sign kept), -0 -> 0x80. Table search, written
    independently of weightbeam's integer bit trick (see encode_e4m3_bits for a cross-check)."""
    q = q.to(torch.float32)
    a = q.abs()
    table = _E4M3_F32
    lo = (torch.searchsorted(table, a.contiguous(), right=True) - 1).clamp(0, 0x7e)
    hi = (lo + 1).clamp(max=0x7e)
    # Both differences are exact in float32 (Sterbenz: table[lo] <= a <= table[hi] <= 2*table[lo]
    # for lo >= 1; for lo == 0 only a == 2^-10 can tie and 2^-9 - 2^-10 is exact).
    d_lo, d_hi = a - table[lo], table[hi] - a
    code = torch.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    code = torch.where(a >= 448.0, torch.full_like(code, 0x7e), code)
    code = torch.where(torch.isnan(q), torch.full_like(code, 0x7f), code)
    code = code | torch.where(torch.signbit(q), 0x80, 0)
    return code.to(torch.uint8)


def encode_e4m3_bits(q):
    """Same result via the integer algorithm of daemon/transform/float_bits.h (cross-check only)."""
    q = q.to(torch.float32).contiguous()
    u = q.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    af = (a.to(torch.int32)).view(torch.float32)
    sub = ((af + torch.tensor(16384.0, dtype=torch.float32)).view(torch.int32).to(torch.int64)
           - 0x46800000)
    r = torch.where(a < 0x3C800000, sub, normal)
    r = torch.where(a >= 0x43E00000, torch.full_like(r, 0x7E), r)
    r = torch.where(a > 0x7F800000, torch.full_like(r, 0x7F), r)
    return (sign | r).to(torch.uint8)


def decode_e4m3(codes):
    """uint8 e4m3fn codes -> float32 (exact); 0x7f/0xff -> NaN."""
    c = codes.to(torch.int64)
    mag = _E4M3_F32[(c & 0x7F).clamp(max=0x7E)]
    mag = torch.where((c & 0x7F) == 0x7F, torch.full_like(mag, float("nan")), mag)
    return torch.where((c & 0x80) != 0, -mag, mag)


def _quantize_2d(x):
    rows, cols = x.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    xf = x.to(torch.float32)
    mag = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf))
    padded = torch.zeros(br * BLOCK, bc * BLOCK, dtype=torch.float32)
    padded[:rows, :cols] = mag
    amax = padded.view(br, BLOCK, bc, BLOCK).amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / torch.tensor(448.0, dtype=torch.float32),
                        torch.ones_like(amax))
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    return encode_e4m3(xf / full), scale


def quantize_fp8_block(x):
    """BF16 [rows, cols] or [E, rows, cols] -> (uint8 codes, float32 scales
    [ceil(rows/128), ceil(cols/128)] (per expert for 3-D)). amax over the finite values of each
    128x128 block (ragged edge blocks are smaller); scale = amax / 448 in float32 (1.0 for an
    all-zero block); q = x / scale in float32, round-to-nearest-even, saturating."""
    assert x.dtype == torch.bfloat16, x.dtype
    if x.dim() == 3:
        parts = [_quantize_2d(x[e]) for e in range(x.shape[0])]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    assert x.dim() == 2
    return _quantize_2d(x)


def dequantize_fp8_block(codes, scales):
    if codes.dim() == 3:
        return torch.stack([dequantize_fp8_block(codes[e], scales[e]) for e in range(codes.shape[0])])
    rows, cols = codes.shape
    full = scales.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    return decode_e4m3(codes) * full


# ------------------------------------------------------------------------------------------
# Engine layouts
# ------------------------------------------------------------------------------------------

def _rows(t, start, size):
    assert 0 <= start and start + size <= t.shape[0], (start, size, t.shape)
    return t.narrow(0, start, size)


def _split(t, dim, n, r):
    assert t.shape[dim] % n == 0, (t.shape, dim, n)
    s = t.shape[dim] // n
    return t.narrow(dim, r * s, s)


def padded_vocab(vocab):
    return -(-vocab // VOCAB_PAD) * VOCAB_PAD


def vocab_rows(vocab, tp, r):
    """(rows per partition, [start, end) of the HF rows rank r holds). Rows past end-start are
    padding (zero-filled by the engines' loaders)."""
    vp = padded_vocab(vocab)
    assert vp % tp == 0, (vp, tp)
    per = vp // tp
    return per, min(r * per, vocab), min((r + 1) * per, vocab)


def _vocab_shard(w, tp, r):
    per, start, end = vocab_rows(w.shape[0], tp, r)
    out = torch.zeros(per, w.shape[1], dtype=w.dtype)
    out[: end - start] = w[start:end]
    return out


def kv_heads_for_rank(num_kv_heads, tp, r):
    """(first kv head, kv heads on this rank, replicas per kv head)."""
    if tp >= num_kv_heads:
        assert tp % num_kv_heads == 0, (tp, num_kv_heads)
        reps = tp // num_kv_heads
        return r // reps, 1, reps
    assert num_kv_heads % tp == 0, (tp, num_kv_heads)
    n = num_kv_heads // tp
    return r * n, n, 1


def experts_for_rank(engine, num_experts, ep, ep_rank):
    """Global expert ids held by ep_rank (ascending; local index = position)."""
    if ep == 1:
        return list(range(num_experts))
    if engine == "vllm":  # 'linear' placement; the first E % ep ranks get one extra expert
        base, rem = divmod(num_experts, ep)
        start = ep_rank * base + min(ep_rank, rem)
        return list(range(start, start + base + (1 if ep_rank < rem else 0)))
    assert num_experts % ep == 0, (num_experts, ep)
    n = num_experts // ep
    return list(range(ep_rank * n, (ep_rank + 1) * n))


def moe_parallel(engine, tp, tp_rank, ep, ep_rank):
    """(moe_tp, moe_tp_rank, ep_rank) for the experts.
    vllm: EP replaces TP for experts (moe_tp = 1 when ep > 1; ep = dp * tp,
          ep_rank = dp_rank * tp + tp_rank, default tp_rank).
    sglang: ep divides tp; moe_tp = tp // ep; moe_tp_rank = tp_rank % moe_tp;
            ep_rank = tp_rank // moe_tp (a given ep_rank must match)."""
    if ep == 1:
        return tp, tp_rank, 0
    if engine == "vllm":
        return 1, 0, tp_rank if ep_rank is None else ep_rank
    assert tp % ep == 0, f"sglang needs ep | tp (tp={tp}, ep={ep})"
    mtp = tp // ep
    derived = tp_rank // mtp
    assert ep_rank is None or ep_rank == derived, (ep_rank, derived)
    return mtp, tp_rank % mtp, derived


def _gate_up(gate, up, n, r):
    return torch.cat([_split(gate, 0, n, r), _split(up, 0, n, r)], 0)


def expected_engine_params(hf, config, engine, tp, tp_rank, ep=1, ep_rank=None, fp8=False,
                           sglang_fused_shared_experts=False):
    """Parameters of inference rank (tp_rank of tp; ep_rank of ep for experts) as the engine's
    loader leaves them. Names are the engine's named_parameters() names."""
    assert engine in ENGINES, engine
    assert 0 <= tp_rank < tp
    fam = _family(config)
    H = config["hidden_size"]
    out = {}
    fused_shared = (engine == "sglang" and sglang_fused_shared_experts and fam == "deepseek"
                    and config.get("n_shared_experts"))
    if fused_shared:
        assert ep == 1, "sglang disables shared-expert fusion under EP"

    out["model.embed_tokens.weight"] = _vocab_shard(hf["model.embed_tokens.weight"], tp, tp_rank)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"].clone()
        a = p + "self_attn."
        if fam == "deepseek":
            nh = config["num_attention_heads"]
            assert nh % tp == 0
            if config.get("q_lora_rank") is not None:
                fused = torch.cat([hf[a + "q_a_proj.weight"], hf[a + "kv_a_proj_with_mqa.weight"]], 0)
                name = "fused_qkv_a_proj" if engine == "vllm" else "fused_qkv_a_proj_with_mqa"
                out[a + name + ".weight"] = fused
                out[a + "q_a_layernorm.weight"] = hf[a + "q_a_layernorm.weight"].clone()
                out[a + "q_b_proj.weight"] = _split(hf[a + "q_b_proj.weight"], 0, tp, tp_rank).clone()
            else:
                out[a + "q_proj.weight"] = _split(hf[a + "q_proj.weight"], 0, tp, tp_rank).clone()
                out[a + "kv_a_proj_with_mqa.weight"] = hf[a + "kv_a_proj_with_mqa.weight"].clone()
            out[a + "kv_a_layernorm.weight"] = hf[a + "kv_a_layernorm.weight"].clone()
            out[a + "kv_b_proj.weight"] = _split(hf[a + "kv_b_proj.weight"], 0, tp, tp_rank).clone()
            out[a + "o_proj.weight"] = _split(hf[a + "o_proj.weight"], 1, tp, tp_rank).clone()
        else:
            D, nh, nkv = _head_dim(config), config["num_attention_heads"], config["num_key_value_heads"]
            assert nh % tp == 0
            nq = nh // tp
            k0, nk, _ = kv_heads_for_rank(nkv, tp, tp_rank)
            parts = {"q": _rows(hf[a + "q_proj.weight"], tp_rank * nq * D, nq * D),
                     "k": _rows(hf[a + "k_proj.weight"], k0 * D, nk * D),
                     "v": _rows(hf[a + "v_proj.weight"], k0 * D, nk * D)}
            out[a + "qkv_proj.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], 0)
            if a + "q_proj.bias" in hf:
                out[a + "qkv_proj.bias"] = torch.cat([
                    _rows(hf[a + "q_proj.bias"], tp_rank * nq * D, nq * D),
                    _rows(hf[a + "k_proj.bias"], k0 * D, nk * D),
                    _rows(hf[a + "v_proj.bias"], k0 * D, nk * D)], 0)
            if a + "q_norm.weight" in hf:
                out[a + "q_norm.weight"] = hf[a + "q_norm.weight"].clone()
                out[a + "k_norm.weight"] = hf[a + "k_norm.weight"].clone()
            out[a + "o_proj.weight"] = _split(hf[a + "o_proj.weight"], 1, tp, tp_rank).clone()
        out[p + "post_attention_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"].clone()

        m = p + "mlp."
        if _is_moe_layer(config, i):
            E = _num_experts(config)
            out[m + "gate.weight"] = hf[m + "gate.weight"].clone()
            if m + "gate.e_score_correction_bias" in hf:
                out[m + "gate.e_score_correction_bias"] = hf[m + "gate.e_score_correction_bias"].clone()
            mtp, mtr, er = moe_parallel(engine, tp, tp_rank, ep, ep_rank)
            ids = experts_for_rank(engine, E, ep, er)
            w13, w2 = [], []
            srcs = [m + f"experts.{e}." for e in ids]
            if fused_shared:
                srcs.append(m + "shared_experts.")  # appended as expert index E
            for s in srcs:
                w13.append(_gate_up(hf[s + "gate_proj.weight"], hf[s + "up_proj.weight"], mtp, mtr))
                w2.append(_split(hf[s + "down_proj.weight"], 1, mtp, mtr))
            out[m + "experts.w13_weight"] = torch.stack(w13)
            out[m + "experts.w2_weight"] = torch.stack(w2)
            if fam == "deepseek" and config.get("n_shared_experts") and not fused_shared:
                s = m + "shared_experts."
                out[s + "gate_up_proj.weight"] = _gate_up(hf[s + "gate_proj.weight"],
                                                          hf[s + "up_proj.weight"], tp, tp_rank)
                out[s + "down_proj.weight"] = _split(hf[s + "down_proj.weight"], 1, tp, tp_rank).clone()
        else:
            out[m + "gate_up_proj.weight"] = _gate_up(hf[m + "gate_proj.weight"],
                                                      hf[m + "up_proj.weight"], tp, tp_rank)
            out[m + "down_proj.weight"] = _split(hf[m + "down_proj.weight"], 1, tp, tp_rank).clone()
    out["model.norm.weight"] = hf["model.norm.weight"].clone()
    if not config.get("tie_word_embeddings", False):
        out["lm_head.weight"] = _vocab_shard(hf["lm_head.weight"], tp, tp_rank)

    if fp8:
        out = _apply_fp8(out)
    return out


FP8_SUFFIXES = (".qkv_proj.weight", ".o_proj.weight", ".gate_up_proj.weight", ".down_proj.weight",
                ".fused_qkv_a_proj.weight", ".fused_qkv_a_proj_with_mqa.weight",
                ".q_b_proj.weight", ".kv_b_proj.weight", ".q_proj.weight",
                ".kv_a_proj_with_mqa.weight", ".experts.w13_weight", ".experts.w2_weight")


def is_fp8_param(name):
    return name.endswith(FP8_SUFFIXES)


def _apply_fp8(params):
    out = {}
    for name, t in params.items():
        if is_fp8_param(name):
            codes, scales = quantize_fp8_block(t)
            out[name] = codes
            out[name + "_scale_inv"] = scales
        else:
            out[name] = t
    return out


def mla_derived_buffers(params, config, tp):
    """Buffers the MLA backends derive from kv_b_proj after loading (NOT refreshed by a raw write
    into kv_b_proj): logical W_UK_T / w_kc [H_local, nope, kv_lora] and W_UV / w_vc
    [H_local, kv_lora, v]. FP8 kv_b_proj is dequantised first (BF16 result)."""
    nope, vd = config["qk_nope_head_dim"], config["v_head_dim"]
    out = {}
    for name, w in params.items():
        if not name.endswith("kv_b_proj.weight"):
            continue
        if w.dtype == torch.uint8:
            w = dequantize_fp8_block(w, params[name + "_scale_inv"]).to(torch.bfloat16)
        base = name[: -len("kv_b_proj.weight")]
        hl = config["num_attention_heads"] // tp
        wk, wv = w.view(hl, nope + vd, w.shape[1]).split([nope, vd], dim=1)
        out[base + "w_kc"] = wk.contiguous()                   # [hl, nope, kv_lora]
        out[base + "w_vc"] = wv.transpose(1, 2).contiguous()   # [hl, kv_lora, v]
    return out


# ------------------------------------------------------------------------------------------
# Self-check
# ------------------------------------------------------------------------------------------

class _Fail(Exception):
    pass


def _check(cond, msg):
    if not cond:
        raise _Fail(msg)


def _eq(a, b, msg):
    _check(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b),
           f"{msg}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")


def _expected_shapes(config, engine, tp, r, ep, ep_rank, fused_shared=False):
    """Shapes from the closed-form formulas in engines.md (independent of the builders)."""
    fam, H, V = _family(config), config["hidden_size"], config["vocab_size"]
    s = {"model.embed_tokens.weight": (padded_vocab(V) // tp, H), "model.norm.weight": (H,)}
    if not config.get("tie_word_embeddings"):
        s["lm_head.weight"] = (padded_vocab(V) // tp, H)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        a = p + "self_attn."
        if fam == "deepseek":
            hl = config["num_attention_heads"] // tp
            nope, rope, vd = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
            ql, kvl = config.get("q_lora_rank"), config["kv_lora_rank"]
            if ql is not None:
                nm = "fused_qkv_a_proj" if engine == "vllm" else "fused_qkv_a_proj_with_mqa"
                s[a + nm + ".weight"] = (ql + kvl + rope, H)
                s[a + "q_a_layernorm.weight"] = (ql,)
                s[a + "q_b_proj.weight"] = (hl * (nope + rope), ql)
            else:
                s[a + "q_proj.weight"] = (hl * (nope + rope), H)
                s[a + "kv_a_proj_with_mqa.weight"] = (kvl + rope, H)
            s[a + "kv_a_layernorm.weight"] = (kvl,)
            s[a + "kv_b_proj.weight"] = (hl * (nope + vd), kvl)
            s[a + "o_proj.weight"] = (H, hl * vd)
        else:
            D, nh, nkv = _head_dim(config), config["num_attention_heads"], config["num_key_value_heads"]
            nkl = max(1, nkv // tp)
            s[a + "qkv_proj.weight"] = ((nh // tp + 2 * nkl) * D, H)
            if config["model_type"] == "qwen2":
                s[a + "qkv_proj.bias"] = ((nh // tp + 2 * nkl) * D,)
            if config["model_type"] in ("qwen3", "qwen3_moe"):
                s[a + "q_norm.weight"] = (D,)
                s[a + "k_norm.weight"] = (D,)
            s[a + "o_proj.weight"] = (H, nh * D // tp)
        m = p + "mlp."
        if _is_moe_layer(config, i):
            E, Im = _num_experts(config), config["moe_intermediate_size"]
            if ep == 1:
                el, itp = E, Im // tp
            elif engine == "vllm":
                el, itp = E // ep + (1 if ep_rank < E % ep else 0), Im
            else:
                el, itp = E // ep, Im // (tp // ep)
            if fused_shared:
                el += 1
            s[m + "gate.weight"] = (E, H)
            if fam == "deepseek":
                s[m + "gate.e_score_correction_bias"] = (E,)
                if not fused_shared:
                    Is = Im * config["n_shared_experts"]
                    s[m + "shared_experts.gate_up_proj.weight"] = (2 * Is // tp, H)
                    s[m + "shared_experts.down_proj.weight"] = (H, Is // tp)
            s[m + "experts.w13_weight"] = (el, 2 * itp, H)
            s[m + "experts.w2_weight"] = (el, H, itp)
        else:
            I = config["intermediate_size"]
            s[m + "gate_up_proj.weight"] = (2 * I // tp, H)
            s[m + "down_proj.weight"] = (H, I // tp)
    return s


def _check_shapes(params, config, engine, tp, r, ep, ep_rank, fp8, fused_shared=False):
    exp = _expected_shapes(config, engine, tp, r, ep, ep_rank, fused_shared)
    names = set(params)
    want = set(exp)
    if fp8:
        want |= {n + "_scale_inv" for n in exp if is_fp8_param(n)}
    _check(names == want, f"name set differs: extra {sorted(names - want)[:4]} "
                          f"missing {sorted(want - names)[:4]}")
    for n, shp in exp.items():
        _check(tuple(params[n].shape) == shp, f"{n}: shape {tuple(params[n].shape)} != {shp}")
        if fp8 and is_fp8_param(n):
            _check(params[n].dtype == torch.uint8, n)
            sc = params[n + "_scale_inv"]
            want_sc = shp[:-2] + (math.ceil(shp[-2] / BLOCK), math.ceil(shp[-1] / BLOCK))
            _check(tuple(sc.shape) == want_sc and sc.dtype == torch.float32,
                   f"{n}_scale_inv shape {tuple(sc.shape)} != {want_sc}")
        elif n.endswith("e_score_correction_bias"):
            _check(params[n].dtype == torch.float32, n)
        else:
            _check(params[n].dtype == torch.bfloat16, f"{n}: {params[n].dtype}")


def _check_reassembly(hf, config, engine, tp, ranks, ep):
    """Rebuild HF tensors from all ranks' BF16 params (independent of the slicing code path)."""
    fam = _family(config)
    H, V = config["hidden_size"], config["vocab_size"]
    # vocab: real rows in rank order, padding zero
    for hn, en in (("model.embed_tokens.weight", "model.embed_tokens.weight"),
                   ("lm_head.weight", "lm_head.weight")):
        if hn not in hf:
            continue
        real, per = [], padded_vocab(V) // tp
        for r in range(tp):
            t = ranks[r][en]
            n = max(0, min(V - r * per, per))
            real.append(t[:n])
            _check(bool((t[n:] == 0).all()), f"{en} rank {r}: padding rows not zero")
        _eq(torch.cat(real), hf[hn], f"reassembled {hn}")
    replicated = ["model.norm.weight"]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        replicated += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if fam == "deepseek":
            replicated += [a + "kv_a_layernorm.weight"]
            nope, rope, vd = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
            if config.get("q_lora_rank") is not None:
                nm = "fused_qkv_a_proj" if engine == "vllm" else "fused_qkv_a_proj_with_mqa"
                replicated += [a + nm + ".weight", a + "q_a_layernorm.weight"]
                ql = config["q_lora_rank"]
                f = ranks[0][a + nm + ".weight"]
                _eq(f[:ql], hf[a + "q_a_proj.weight"], "fused a: q_a rows")
                _eq(f[ql:], hf[a + "kv_a_proj_with_mqa.weight"], "fused a: kv_a rows")
                qn = "q_b_proj.weight"
            else:
                replicated += [a + "kv_a_proj_with_mqa.weight"]
                qn = "q_proj.weight"
            # per-head view: rank r holds heads [r*hl, (r+1)*hl)
            _eq(torch.cat([ranks[r][a + qn] for r in range(tp)]), hf[a + qn], "q heads")
            _eq(torch.cat([ranks[r][a + "kv_b_proj.weight"] for r in range(tp)]),
                hf[a + "kv_b_proj.weight"], "kv_b heads")
        else:
            D, nh, nkv = _head_dim(config), config["num_attention_heads"], config["num_key_value_heads"]
            nq = nh // tp
            qs, ks, vs = [], {}, {}
            for r in range(tp):
                w = ranks[r][a + "qkv_proj.weight"]
                nkl = max(1, nkv // tp)
                q, k, v = w.split([nq * D, nkl * D, nkl * D])
                qs.append(q)
                first = (r * nkv) // tp  # first kv head whose queries this rank serves
                for j in range(nkl):
                    head = first + j
                    for store, x in ((ks, k), (vs, v)):
                        blk = x[j * D:(j + 1) * D]
                        if head in store:
                            _eq(blk, store[head], f"replicated kv head {head}")
                        store[head] = blk
                # GQA consistency: query head h of this rank uses kv head h // (nh // nkv)
                for h in range(r * nq, (r + 1) * nq):
                    _check(first <= h // (nh // nkv) < first + nkl, "q head without its kv head")
            _eq(torch.cat(qs), hf[a + "q_proj.weight"], "q_proj from ranks")
            _eq(torch.cat([ks[h] for h in range(nkv)]), hf[a + "k_proj.weight"], "k_proj")
            _eq(torch.cat([vs[h] for h in range(nkv)]), hf[a + "v_proj.weight"], "v_proj")
            if a + "q_norm.weight" in hf:
                replicated += [a + "q_norm.weight", a + "k_norm.weight"]
        _eq(torch.cat([ranks[r][a + "o_proj.weight"] for r in range(tp)], 1),
            hf[a + "o_proj.weight"], "o_proj from ranks")
        m = p + "mlp."
        if _is_moe_layer(config, i):
            replicated += [m + "gate.weight"]
            if fam == "deepseek":
                replicated += [m + "gate.e_score_correction_bias"]
            E = _num_experts(config)
            seen = {}
            for r in range(tp):
                mtp, mtr, er = moe_parallel(engine, tp, r, ep, None)
                ids = experts_for_rank(engine, E, ep, er)
                w13, w2 = ranks[r][m + "experts.w13_weight"], ranks[r][m + "experts.w2_weight"]
                for li, e in enumerate(ids):
                    half = w13.shape[1] // 2
                    seen.setdefault(e, {})[mtr] = (w13[li, :half], w13[li, half:], w2[li])
            if engine == "vllm" and ep > 1:
                # with ep == tp every expert is on exactly one rank; ep > tp needs other dp ranks
                if ep == tp:
                    _check(sorted(seen) == list(range(E)), "vllm EP placement misses experts")
            else:
                _check(sorted(seen) == list(range(E)), "experts missing")
            for e, by in seen.items():
                s = m + f"experts.{e}."
                n = len(by)
                _eq(torch.cat([by[k][0] for k in range(n)]), hf[s + "gate_proj.weight"], f"gate {e}")
                _eq(torch.cat([by[k][1] for k in range(n)]), hf[s + "up_proj.weight"], f"up {e}")
                _eq(torch.cat([by[k][2] for k in range(n)], 1), hf[s + "down_proj.weight"], f"down {e}")
            if fam == "deepseek":
                s = m + "shared_experts."
                gu = [ranks[r][s + "gate_up_proj.weight"] for r in range(tp)]
                _eq(torch.cat([g[: g.shape[0] // 2] for g in gu]), hf[s + "gate_proj.weight"], "shared gate")
                _eq(torch.cat([g[g.shape[0] // 2:] for g in gu]), hf[s + "up_proj.weight"], "shared up")
                _eq(torch.cat([ranks[r][s + "down_proj.weight"] for r in range(tp)], 1),
                    hf[s + "down_proj.weight"], "shared down")
        else:
            gu = [ranks[r][m + "gate_up_proj.weight"] for r in range(tp)]
            _eq(torch.cat([g[: g.shape[0] // 2] for g in gu]), hf[m + "gate_proj.weight"], "gate")
            _eq(torch.cat([g[g.shape[0] // 2:] for g in gu]), hf[m + "up_proj.weight"], "up")
            _eq(torch.cat([ranks[r][m + "down_proj.weight"] for r in range(tp)], 1),
                hf[m + "down_proj.weight"], "down")
    for n in replicated:
        hn = n
        if n.endswith("fused_qkv_a_proj.weight") or n.endswith("fused_qkv_a_proj_with_mqa.weight"):
            for r in range(tp):
                _eq(ranks[r][n], ranks[0][n], f"{n} replicated")
            continue
        for r in range(tp):
            _eq(ranks[r][n], hf[hn], f"{n} replicated on rank {r}")


def _check_fp8(bf16, q):
    for n, t in bf16.items():
        if not is_fp8_param(n):
            _eq(q[n], t, f"{n} must stay unquantised")
            continue
        codes, sc = q[n], q[n + "_scale_inv"]
        deq = dequantize_fp8_block(codes, sc)
        x = t.to(torch.float32)
        full = sc if sc.dim() == 3 else sc.unsqueeze(0)
        # scale = block amax / 448 exactly
        x3 = x if x.dim() == 3 else x.unsqueeze(0)
        for e in range(x3.shape[0]):
            rows, cols = x3.shape[1:]
            for bi in range(full.shape[1]):
                for bj in range(full.shape[2]):
                    blk = x3[e, bi * BLOCK:(bi + 1) * BLOCK, bj * BLOCK:(bj + 1) * BLOCK]
                    am = blk.abs().max()
                    want = am / torch.tensor(448.0) if am > 0 else torch.tensor(1.0)
                    _check(float(full[e, bi, bj]) == float(want), f"{n}: scale [{e},{bi},{bj}]")
            break  # one expert is enough for the scale check
        sfull = (sc.repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1))[..., : x.shape[-2], : x.shape[-1]]
        tol = torch.maximum(x.abs() * 2.0 ** -4, sfull * 2.0 ** -9) + 1e-12
        _check(bool(((deq - x).abs() <= tol).all()), f"{n}: dequantised not close")


def _self_test_encoder():
    g = torch.Generator().manual_seed(7)
    vals = torch.cat([
        torch.randn(200000, generator=g) * 100,
        torch.randn(200000, generator=g) * 0.01,
        torch.randn(50000, generator=g) * 1e-4,
        torch.tensor([0.0, -0.0, 448.0, -448.0, 449.0, 464.0, 480.0, 1e9, float("inf"),
                      -float("inf"), float("nan"), 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10,
                      2.0 ** -6, 1.0625, 1.1875, -1.0625, 17.0, 19.0, 2.0 ** -7 * 1.5]),
        decode_e4m3(torch.arange(256, dtype=torch.int64).to(torch.uint8)).nan_to_num(0.0),
    ]).to(torch.float32)
    # midpoints between neighbouring codes are exact ties
    mids = ((_E4M3[:-1] + _E4M3[1:]) / 2).to(torch.float32)
    vals = torch.cat([vals, mids, -mids])
    a, b = encode_e4m3(vals), encode_e4m3_bits(vals)
    bad = (a != b).nonzero()
    _check(bad.numel() == 0, f"table vs bit encoder differ at {vals[bad[:5, 0]].tolist()}")
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    dec = decode_e4m3(codes)
    finite = ~torch.isnan(dec)
    _check(torch.equal(encode_e4m3(dec[finite]), codes[finite]), "decode/encode round trip")
    _check(encode_e4m3(torch.tensor([1.0625]))[0] == 0x38, "tie 1.0625 -> 1.0 (even)")
    _check(encode_e4m3(torch.tensor([1.1875]))[0] == 0x3a, "tie 1.1875 -> 1.25 (even)")


def _cross_check_numpy_reference():
    """Compare with tests/python/fp8_reference.py (NumPy) when it can be found."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here,):
        if os.path.exists(os.path.join(d, "fp8_reference.py")):
            sys.path.insert(0, d)
            try:
                import fp8_reference  # noqa: F401
            except Exception:  # numpy missing etc.
                return "skipped (import failed)"
            finally:
                sys.path.pop(0)
            g = torch.Generator().manual_seed(3)
            for shape in ((300, 200), (128, 128), (5, 700)):
                x = (torch.randn(*shape, generator=g) * 0.3).to(torch.bfloat16)
                x[0, 0] = 0.0
                c, s = quantize_fp8_block(x)
                cn, sn = fp8_reference.quantize_fp8_blocks(x.to(torch.float32).numpy())
                _check(torch.equal(c, torch.from_numpy(cn)), f"codes differ from numpy ref {shape}")
                _check(torch.equal(s, torch.from_numpy(sn)), f"scales differ from numpy ref {shape}")
            return "ok"
    return "skipped (fp8_reference.py not found)"


def _combos(config, engine):
    out = [(tp, 1) for tp in (1, 2, 4, 8)]
    if _family(config) in ("moe", "deepseek"):
        for tp in (1, 2, 4, 8):
            if engine == "vllm" and tp in (1, 2):   # ep = dp * tp with dp = 2 / 1
                out.append((tp, 2))
            if engine == "sglang" and tp % 2 == 0:  # ep | tp
                out.append((tp, 2))
    return out


def fp8_engine_valid_tps(config, engine="vllm"):
    """tp values for which every FP8 per-rank partition the engines check is a multiple of 128
    (vLLM validate_block_quant_shapes / Fp8MoEMethod): column outputs, row inputs, expert I/tp."""
    fam, H = _family(config), config["hidden_size"]
    ok = []
    for tp in (1, 2, 4, 8):
        dims = []
        if fam == "deepseek":
            hl = config["num_attention_heads"] // tp
            dims += [hl * (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]),
                     hl * (config["qk_nope_head_dim"] + config["v_head_dim"]),
                     hl * config["v_head_dim"]]
            dims += [config["intermediate_size"] // tp,
                     config["moe_intermediate_size"] * config["n_shared_experts"] // tp]
        else:
            D = _head_dim(config)
            dims += [config["num_attention_heads"] // tp * D,
                     max(1, config["num_key_value_heads"] // tp) * D]
            if fam == "dense":
                dims += [config["intermediate_size"] // tp]
        if fam in ("moe", "deepseek"):
            dims += [config["moe_intermediate_size"] // tp]
        if all(d % BLOCK == 0 for d in dims):
            ok.append(tp)
    return ok


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    if "--write-configs" in argv:
        os.makedirs(os.path.join(here, "configs"), exist_ok=True)
        for k, c in CONFIGS.items():
            with open(os.path.join(here, "configs", k + ".json"), "w") as f:
                json.dump(c, f, indent=2)
                f.write("\n")
        print("wrote configs/*.json")
        return 0
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.time()
    failures = 0
    _self_test_encoder()
    print(f"e4m3 encoder: table == bit algorithm on edge cases and ties: ok")
    print(f"numpy fp8_reference cross-check: {_cross_check_numpy_reference()}")

    configs = dict(CONFIGS)
    ds = dict(CONFIGS["deepseek_v3"])
    ds.update({"q_lora_rank": None, "num_hidden_layers": 2, "model_type": "deepseek_v2"})
    configs["deepseek_v2_no_q_lora"] = ds
    rows = []
    for fam_name, config in configs.items():
        hf = random_hf_weights(config, seed=zlib.crc32(fam_name.encode()) % 1000)
        for engine in ENGINES:
            for tp, ep in _combos(config, engine):
                tc = time.time()
                try:
                    ranks = []
                    for r in range(tp):
                        er = None
                        if engine == "vllm" and ep > 1 and ep != tp:
                            er = r  # dp_rank 0 of ep // tp data-parallel replicas
                        prm = expected_engine_params(hf, config, engine, tp, r, ep, er)
                        eff_er = moe_parallel(engine, tp, r, ep, er)[2]
                        _check_shapes(prm, config, engine, tp, r, ep, eff_er, fp8=False)
                        ranks.append(prm)
                    if engine == "vllm" and ep > tp:  # other dp replicas hold the other experts
                        for r2 in range(tp, ep):
                            prm = expected_engine_params(hf, config, engine, tp, r2 % tp, ep, r2)
                            _check_shapes(prm, config, engine, tp, r2 % tp, ep, r2, fp8=False)
                    _check_reassembly(hf, config, engine, tp, ranks, ep)
                    # FP8 on the last rank of a few combinations only, to keep the run short (the
                    # quantiser is layout-independent; sglang tensors equal vllm's, checked below).
                    do_fp8 = ((engine == "vllm" and (tp in (1, 8) or ep > 1)) or
                              (engine == "sglang" and tp == 4 and ep == 1))
                    do_fp8 = do_fp8 and (fam_name != "deepseek_v2_no_q_lora" or tp == 8)
                    if do_fp8:
                        for r in [tp - 1]:
                            q = _apply_fp8(ranks[r])
                            er = r if (engine == "vllm" and ep > 1 and ep != tp) else None
                            eff_er = moe_parallel(engine, tp, r, ep, er)[2]
                            _check_shapes(q, config, engine, tp, r, ep, eff_er, fp8=True)
                            _check_fp8(ranks[r], q)
                    if engine == "sglang":
                        other = [expected_engine_params(hf, config, "vllm", tp, r, ep if ep <= tp else 1)
                                 for r in range(tp)] if ep in (1, tp) else None
                        if other is not None:
                            for r in range(tp):
                                for n, t in ranks[r].items():
                                    _eq(t, other[r][n.replace("fused_qkv_a_proj_with_mqa", "fused_qkv_a_proj")],
                                        f"vllm vs sglang {n}")
                    status = "ok"
                except _Fail as e:
                    failures += 1
                    status = f"FAIL: {e}"
                n_params = len(ranks[0]) if ranks else 0
                rows.append((fam_name, engine, tp, ep, n_params, status, time.time() - tc))
        if _family(config) == "deepseek" and config.get("n_shared_experts"):
            # SGLang shared-expert fusion: expert index E is the shared expert
            try:
                for tp in (1, 2):
                    for r in range(tp):
                        prm = expected_engine_params(hf, config, "sglang", tp, r,
                                                     sglang_fused_shared_experts=True)
                        _check_shapes(prm, config, "sglang", tp, r, 1, 0, False, fused_shared=True)
                        for i in range(config["num_hidden_layers"]):
                            if not _is_moe_layer(config, i):
                                continue
                            m = f"model.layers.{i}.mlp."
                            w13 = prm[m + "experts.w13_weight"]
                            half = w13.shape[1] // 2
                            E = _num_experts(config)
                            _eq(w13[E, :half], _split(hf[m + "shared_experts.gate_proj.weight"], 0, tp, r),
                                "fused shared gate")
                            _eq(w13[E, half:], _split(hf[m + "shared_experts.up_proj.weight"], 0, tp, r),
                                "fused shared up")
                            _eq(prm[m + "experts.w2_weight"][E],
                                _split(hf[m + "shared_experts.down_proj.weight"], 1, tp, r), "fused shared down")
                rows.append((fam_name, "sglang+fused_shared", "1,2", 1, len(prm), "ok", 0.0))
            except _Fail as e:
                failures += 1
                rows.append((fam_name, "sglang+fused_shared", "1,2", 1, 0, f"FAIL: {e}", 0.0))
            prm = expected_engine_params(hf, config, "vllm", 2, 1, fp8=True)
            d = mla_derived_buffers(prm, config, 2)
            k = "model.layers.0.self_attn."
            _check(tuple(d[k + "w_kc"].shape) == (config["num_attention_heads"] // 2,
                   config["qk_nope_head_dim"], config["kv_lora_rank"]), "w_kc shape")

    print(f"{'family':24} {'engine':20} {'tp':>4} {'ep':>3} {'params':>7}  {'secs':>5}  status")
    for fam_name, engine, tp, ep, n, status, secs in rows:
        print(f"{fam_name:24} {engine:20} {tp!s:>4} {ep:>3} {n:>7}  {secs:5.2f}  {status}")
    print("FP8 engine-valid tp (all per-rank partitions multiples of 128):")
    for k, c in CONFIGS.items():
        print(f"  {k:12} {fp8_engine_valid_tps(c)}")
    print(f"{'FAIL' if failures else 'PASS'}: {len(rows)} combinations, {failures} failed, "
          f"{time.time() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
