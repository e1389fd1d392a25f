"""An independent torch reference of what trainer ranks hold, built from full Hugging Face
tensors by the trainers' own rules (never by weightbeam's layout code):

* Megatron-core, TransformerEngine layer spec: per query group [q heads; k; v] rows in
  linear_qkv (and its bias), linear_fc1 = [gate_r; up_r], row-parallel linear_proj /
  linear_fc2, vocab padded to make_vocab_size_divisible_by x tp, TE-fused norms
  (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight, pre_mlp_layernorm on MoE
  layers, q_layernorm / k_layernorm), router + expert_bias, TEGroupedMLP experts
  linear_fc1.weight{j} / linear_fc2.weight{j} per EP rank split over ETP, shared experts, MLA.
* DTensor: torch.chunk per mesh dimension (Shard(d)), _StridedShard cut after the plain shards
  (TP-major), Replicate; Transformers-v5 stacked experts gate_up_proj [E, 2I, H], down_proj
  [E, H, I].
"""

import fnmatch

import torch

import engine_reference as ref


def _chunk(t, n, r, dim=0):
    return t.chunk(n, dim=dim)[r] if n > 1 else t


def _padded_rows(t, rows):
    out = torch.zeros((rows,) + tuple(t.shape[1:]), dtype=t.dtype)
    out[:t.shape[0]] = t
    return out


def megatron_rank(hf, config, tp=1, tp_rank=0, pp=1, pp_rank=0, ep=1, ep_rank=0, etp=1,
                  etp_rank=0, layers=None, vocab_divisible_by=128):
    """The named parameters (and router expert_bias buffers) of one Megatron-core rank."""
    fam = ref._family(config)
    L, V = config["num_hidden_layers"], config["vocab_size"]
    if layers is None:
        per = L // pp
        layers = list(range(pp_rank * per, (pp_rank + 1) * per))
    first = pp_rank == 0 and (not layers or layers[0] == 0)
    last = pp_rank == pp - 1 and (not layers or layers[-1] == L - 1)
    multiple = vocab_divisible_by * tp
    padded = -(-V // multiple) * multiple
    out = {}
    if first:
        out["embedding.word_embeddings.weight"] = _chunk(
            _padded_rows(hf["model.embed_tokens.weight"], padded), tp, tp_rank)
    for local, g in enumerate(layers):
        m, h = f"decoder.layers.{local}.", f"model.layers.{g}."
        a, s = m + "self_attention.", h + "self_attn."
        if fam == "deepseek":
            out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
            if config.get("q_lora_rank"):
                out[a + "linear_q_down_proj.weight"] = hf[s + "q_a_proj.weight"]
                out[a + "linear_q_up_proj.layer_norm_weight"] = hf[s + "q_a_layernorm.weight"]
                out[a + "linear_q_up_proj.weight"] = _chunk(hf[s + "q_b_proj.weight"], tp,
                                                            tp_rank)
            else:
                out[a + "linear_q_proj.weight"] = _chunk(hf[s + "q_proj.weight"], tp, tp_rank)
            out[a + "linear_kv_down_proj.weight"] = hf[s + "kv_a_proj_with_mqa.weight"]
            out[a + "linear_kv_up_proj.layer_norm_weight"] = hf[s + "kv_a_layernorm.weight"]
            out[a + "linear_kv_up_proj.weight"] = _chunk(hf[s + "kv_b_proj.weight"], tp, tp_rank)
        else:
            out[a + "linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
            nh, ng = config["num_attention_heads"], config["num_key_value_heads"]
            d = config.get("head_dim") or config["hidden_size"] // nh
            for what in ("weight", "bias"):
                q = hf.get(f"{s}q_proj.{what}")
                if q is None:
                    continue
                k, v = hf[f"{s}k_proj.{what}"], hf[f"{s}v_proj.{what}"]
                tail = tuple(q.shape[1:])
                groups = torch.cat([q.reshape((ng, nh // ng * d) + tail),
                                    k.reshape((ng, d) + tail), v.reshape((ng, d) + tail)], dim=1)
                out[f"{a}linear_qkv.{what}"] = _chunk(groups, tp, tp_rank).reshape((-1,) + tail)
            if s + "q_norm.weight" in hf:
                out[a + "q_layernorm.weight"] = hf[s + "q_norm.weight"]
                out[a + "k_layernorm.weight"] = hf[s + "k_norm.weight"]
        out[a + "linear_proj.weight"] = _chunk(hf[s + "o_proj.weight"], tp, tp_rank, dim=1)
        mlp = h + "mlp."
        if mlp + "gate.weight" in hf:
            out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
            out[m + "mlp.router.weight"] = hf[mlp + "gate.weight"]
            if mlp + "gate.e_score_correction_bias" in hf:
                out[m + "mlp.router.expert_bias"] = hf[mlp + "gate.e_score_correction_bias"]
            E = hf[mlp + "gate.weight"].shape[0]
            for j in range(E // ep):
                e = f"{mlp}experts.{ep_rank * (E // ep) + j}."
                out[f"{m}mlp.experts.linear_fc1.weight{j}"] = torch.cat(
                    [_chunk(hf[e + "gate_proj.weight"], etp, etp_rank),
                     _chunk(hf[e + "up_proj.weight"], etp, etp_rank)])
                out[f"{m}mlp.experts.linear_fc2.weight{j}"] = _chunk(
                    hf[e + "down_proj.weight"], etp, etp_rank, dim=1)
            x = mlp + "shared_experts."
            if x + "gate_proj.weight" in hf:
                out[m + "mlp.shared_experts.linear_fc1.weight"] = torch.cat(
                    [_chunk(hf[x + "gate_proj.weight"], tp, tp_rank),
                     _chunk(hf[x + "up_proj.weight"], tp, tp_rank)])
                out[m + "mlp.shared_experts.linear_fc2.weight"] = _chunk(
                    hf[x + "down_proj.weight"], tp, tp_rank, dim=1)
        else:
            out[m + "mlp.linear_fc1.layer_norm_weight"] = hf[h + "post_attention_layernorm.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat(
                [_chunk(hf[mlp + "gate_proj.weight"], tp, tp_rank),
                 _chunk(hf[mlp + "up_proj.weight"], tp, tp_rank)])
            out[m + "mlp.linear_fc2.weight"] = _chunk(hf[mlp + "down_proj.weight"], tp, tp_rank,
                                                      dim=1)
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        # Tied embeddings: with pp > 1 Megatron-core's last stage allocates its own
        # output_layer.weight, all-reduced to equal the first stage's embedding.
        head = hf.get("lm_head.weight")
        if head is None and not first:
            head = hf["model.embed_tokens.weight"]
        if head is not None:
            out["output_layer.weight"] = _chunk(_padded_rows(head, padded), tp, tp_rank)
    return {k: v.contiguous() for k, v in out.items()}


def fused_experts(hf, config):
    """HF tensors with each MoE layer's experts stacked as Transformers v5 holds them."""
    out, layers = {}, {}
    for name, t in hf.items():
        if ".mlp.experts." in name:
            layer, rest = name.split(".mlp.experts.")
            e, proj = rest.split(".", 1)
            layers.setdefault(layer, {}).setdefault(int(e), {})[proj] = t
        else:
            out[name] = t
    for layer, experts in layers.items():
        ids = sorted(experts)
        out[layer + ".mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate_proj.weight"], experts[e]["up_proj.weight"]])
             for e in ids])
        out[layer + ".mlp.experts.down_proj"] = torch.stack(
            [experts[e]["down_proj.weight"] for e in ids])
    return out


def dtensor_local(full, mesh, coords, rules):
    """Each tensor's local shard: ``rules`` are (pattern, [placement per mesh dim]) with
    placements "R", "S(d)", "SS(d)"; the first matching pattern applies, none: replicated."""
    out = {}
    for name, t in full.items():
        placements = next((p for pat, p in rules if fnmatch.fnmatchcase(name, pat)),
                          ["R"] * len(mesh))
        local = t
        plain = [(i, p) for i, p in enumerate(placements) if p.startswith("S(")]
        strided = [(i, p) for i, p in enumerate(placements) if p.startswith("SS(")]
        for i, p in plain + list(reversed(strided)):
            dim = int(p[p.index("(") + 1:-1])
            pieces = local.chunk(mesh[i], dim=dim)
            if coords[i] < len(pieces):
                local = pieces[coords[i]]
            else:
                shape = list(local.shape)
                shape[dim] = 0
                local = local.new_empty(shape)
        out[name] = local.contiguous()
    return out
