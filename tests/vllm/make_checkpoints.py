"""Writes the tiny random Qwen3 and Qwen3-MoE checkpoints the real-engine suite serves: config,
BF16 safetensors weights and a word-level tokenizer, made here with `transformers` and
`tokenizers` (nothing comes from a hub). Usage: make_checkpoints.py OUT_DIR [--seed N]."""

import argparse
import json
import os

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig
from transformers import Qwen3MoeForCausalLM

VOCAB = 500  # not a multiple of 64: the engines pad it, the padding rows are never written

COMMON = dict(vocab_size=VOCAB, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, max_position_embeddings=512, rms_norm_eps=1e-6, torch_dtype="bfloat16")

MODELS = {
    # Tied embeddings, as Qwen3-0.6B ships.
    "qwen3": (Qwen3Config, Qwen3ForCausalLM,
              dict(COMMON, num_hidden_layers=2, intermediate_size=256, tie_word_embeddings=True)),
    # Layer 0 dense (mlp_only_layers), layer 1 MoE: both decoder-layer kinds in one model.
    # Every token goes to every expert (top-k = experts), weighted by the router: a top-2 choice
    # would let the two sides' BF16 rounding pick different experts for a near-tie, a
    # discontinuity no tolerance covers.
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                  dict(COMMON, num_hidden_layers=2, intermediate_size=256,
                       moe_intermediate_size=64, num_experts=4, num_experts_per_tok=4,
                       decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=True,
                       tie_word_embeddings=False)),
}


def write_tokenizer(path):
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1",
                                   bos_token="t2", pad_token="t3")
    fast.save_pretrained(path)


def write_model(out, name, seed):
    config_cls, model_cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    config = config_cls(**kwargs)
    model = model_cls(config).to(torch.bfloat16)
    with torch.no_grad():  # larger than the default init, so versions differ visibly
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.05)
    path = os.path.join(out, name)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    with open(os.path.join(path, "config.json")) as f:
        saved = json.load(f)
    assert saved["architectures"] == [model_cls.__name__], saved["architectures"]
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    for name in MODELS:
        print(write_model(args.out, name, args.seed))


if __name__ == "__main__":
    main()
