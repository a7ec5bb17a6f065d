"""A Hugging Face GPT-2 (or Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Kimi Linear: qwen3_next(), qwen3_5() and kimi_linear()
below) directory written as the GGUF llama.cpp's converter makes of it (convert_hf_to_gguf.py's
GPT2Model, as shared/spec/quantized-formats.md §3 describes it), from the format's definition: the model's
hyper-parameters in gpt2.* keys, the tensors renamed, the Conv1D matrices transposed to [out, in], the causal-mask
buffers left out, the matrices' and embeddings' stored dtypes kept (F32, F16, BF16; 1-D tensors F32), and, when the directory has vocab.json + merges.txt, its
vocabulary as tokenizer.ggml.* keys (byte-level BPE, pre-tokenizer "gpt-2", <|endoftext|> a control token) and its
chat template (chat_template.jinja or tokenizer_config.json's) as tokenizer.chat_template.
Usage:
  /usr/bin/python3 reference/gguf_mirror.py HF_DIR OUT.gguf [--extra-tensor NAME] [--arch NAME] [--pre NAME]
                                                           [--type-of TENSOR=GGML_ID] [--drop-key KEY]
                                                           [--alignment N] [--split N]
The options damage the mirror one way each, for the bad-input tests: a tensor no map reads, another
general.architecture, another tokenizer.ggml.pre, a tensor's type id changed (its bytes re-sized), a key left out. --alignment: general.alignment (default 32, llama.cpp's; then not written). --split N: N files
as llama.cpp's gguf-split writes them (OUT's name gets -0000k-of-0000N). Several mirrors in
one run: their argument lists separated by --next. `--vocab-only TOKENIZER_DIR OUT.gguf` writes Kimi's tiktoken vocabulary
alone, as conversion/kimi_linear.py converts it (kimi_vocab below)."""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as gw  # noqa: E402
from byte_level import byte_to_unicode  # noqa: E402
from safetensors_io import read_checkpoint  # noqa: E402

GGML_OF = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
RENAME = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
          "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def raw(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def gguf_name(name: str):
    """The GGUF name of an HF GPT-2 tensor, or None for the buffers the converter drops."""
    name = name.removeprefix("transformer.")
    if name.endswith((".attn.bias", ".attn.masked_bias")):
        return None
    top = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight", "ln_f.weight": "output_norm.weight",
           "ln_f.bias": "output_norm.bias", "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    assert parts[0] == "h", name
    layer, rest = parts[1], ".".join(parts[2:])
    for hf, gg in RENAME.items():
        if rest.startswith(hf + "."):
            return f"blk.{layer}.{gg}{rest[len(hf):]}"
    raise ValueError(f"unknown GPT-2 tensor {name}")


def gdn_shape(t: dict):
    """What both Qwen converters read of a (text) config: head width, rotary share and base, key and value heads
    and widths."""
    rope = t.get("rope_parameters") or {}
    hd = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    partial = rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    theta = rope.get("rope_theta", t.get("rope_theta", 10000.0))
    return (hd, partial, theta, t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
            t["linear_value_head_dim"])


def qwen3_next(cfg: dict, tensors: dict, arch: str):
    """Qwen3-Next as the converter writes it (conversion/qwen.py's Qwen3NextModel over Qwen2MoeModel): the
    hyper-parameters in qwen3next.* keys; A_log as -exp(A_log), dt_bias as ssm_dt.bias, the conv squeezed,
    every RMSNorm weight but linear_attn.norm as 1 + w, in_proj_qkvz's per-key-head [q, k, v, z] groups regrouped
    into attn_qkv ([q | k | v]) and attn_gate (z), the experts stacked [E, out, in], the shared expert's gate
    [D]. Returns (kvs, [(name, tensor)])."""
    hd, partial, theta, hk, hv, dk, dv = gdn_shape(cfg)
    a = "qwen3next."
    kvs = [("general.architecture", gw.STRING, arch, None),
           (a + "vocab_size", gw.U32, cfg["vocab_size"], None),
           (a + "context_length", gw.U32, cfg.get("max_position_embeddings", 4096), None),
           (a + "embedding_length", gw.U32, cfg["hidden_size"], None),
           (a + "block_count", gw.U32, cfg["num_hidden_layers"], None),
           (a + "feed_forward_length", gw.U32, cfg["intermediate_size"], None),
           (a + "expert_feed_forward_length", gw.U32, cfg["moe_intermediate_size"], None),
           (a + "expert_shared_feed_forward_length", gw.U32, cfg.get("shared_expert_intermediate_size", 0), None),
           (a + "expert_count", gw.U32, cfg["num_experts"], None),
           (a + "expert_used_count", gw.U32, cfg["num_experts_per_tok"], None),
           (a + "attention.head_count", gw.U32, cfg["num_attention_heads"], None),
           (a + "attention.head_count_kv", gw.U32, cfg["num_key_value_heads"], None),
           (a + "attention.key_length", gw.U32, hd, None), (a + "attention.value_length", gw.U32, hd, None),
           (a + "attention.layer_norm_rms_epsilon", gw.F32, cfg.get("rms_norm_eps", 1e-6), None),
           (a + "rope.dimension_count", gw.U32, int(hd * partial), None),
           (a + "rope.freq_base", gw.F32, theta, None),
           (a + "ssm.conv_kernel", gw.U32, cfg["linear_conv_kernel_dim"], None),
           (a + "ssm.state_size", gw.U32, dk, None), (a + "ssm.group_count", gw.U32, hk, None),
           (a + "ssm.time_step_rank", gw.U32, hv, None), (a + "ssm.inner_size", gw.U32, dv * hv, None),
           (a + "full_attention_interval", gw.U32, cfg.get("full_attention_interval", 4), None)]
    out = [("token_embd.weight", tensors["model.embed_tokens.weight"]),
           ("output_norm.weight", tensors["model.norm.weight"].float() + 1)]
    if not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", tensors["lm_head.weight"]))
    E = cfg["num_experts"]
    for l in range(cfg["num_hidden_layers"]):
        h, b = f"model.layers.{l}.", f"blk.{l}."
        g = lambda n: tensors[h + n]
        out += [(b + "attn_norm.weight", g("input_layernorm.weight").float() + 1),
                (b + "post_attention_norm.weight", g("post_attention_layernorm.weight").float() + 1)]
        if h + "linear_attn.A_log" in tensors:
            qkvz = g("linear_attn.in_proj_qkvz.weight")  # [Hk * (2 dk + 2 (hv/hk) dv), D], per key head q, k, v, z
            parts = qkvz.reshape(hk, -1, qkvz.shape[-1]).split([dk, dk, hv // hk * dv, hv // hk * dv], dim=1)
            q, k, v, z = (p.reshape(-1, qkvz.shape[-1]) for p in parts)
            out += [(b + "attn_qkv.weight", torch.cat([q, k, v])), (b + "attn_gate.weight", z),
                    (b + "ssm_ba.weight", g("linear_attn.in_proj_ba.weight")),
                    (b + "ssm_conv1d.weight", g("linear_attn.conv1d.weight").squeeze(1)),
                    (b + "ssm_dt.bias", g("linear_attn.dt_bias")),
                    (b + "ssm_a", -torch.exp(g("linear_attn.A_log").float())),
                    (b + "ssm_norm.weight", g("linear_attn.norm.weight")),
                    (b + "ssm_out.weight", g("linear_attn.out_proj.weight"))]
        else:
            out += [(b + f"attn_{p}.weight", g(f"self_attn.{p}_proj.weight")) for p in "qkv"]
            out += [(b + "attn_output.weight", g("self_attn.o_proj.weight")),
                    (b + "attn_q_norm.weight", g("self_attn.q_norm.weight").float() + 1),
                    (b + "attn_k_norm.weight", g("self_attn.k_norm.weight").float() + 1)]
        if h + "mlp.gate.weight" not in tensors:
            out += [(b + f"ffn_{p}.weight", g(f"mlp.{p}_proj.weight")) for p in ("gate", "up", "down")]
            continue
        out.append((b + "ffn_gate_inp.weight", g("mlp.gate.weight")))
        out += [(b + f"ffn_{p}_exps.weight", torch.stack([g(f"mlp.experts.{e}.{p}_proj.weight") for e in range(E)]))
                for p in ("gate", "up", "down")]
        if h + "mlp.shared_expert_gate.weight" in tensors:
            out.append((b + "ffn_gate_inp_shexp.weight", g("mlp.shared_expert_gate.weight").reshape(-1)))
            out += [(b + f"ffn_{p}_shexp.weight", g(f"mlp.shared_expert.{p}_proj.weight")) for p in ("gate", "up", "down")]
    return kvs, out


def tiled_v_heads(t: torch.Tensor, dim: int, hk: int, r: int, hd: int) -> torch.Tensor:
    """The converter's V-head reorder for Qwen3.5 (hk key heads, r value heads each, hd wide along `dim`): from
    grouped by key head [G0_v0..v(r-1), G1_v0..] to tiled [G0_v0, G1_v0, .., G0_v1, G1_v1, ..]."""
    shape = list(t.shape)
    dim %= len(shape)
    t = t.reshape(*shape[:dim], hk, r, hd, *shape[dim + 1:]).transpose(dim, dim + 1)
    return t.contiguous().reshape(*shape)


def qwen3_5(cfg: dict, tensors: dict, arch: str):
    """Qwen3.5 (dense, `qwen35`) and Qwen3.5-MoE (`qwen35moe`) as the converter writes them: Qwen3-Next's changes
    (A_log, dt_bias, conv, 1 + w norms; no qkvz) on the text model (model.language_model.*), in_proj_qkv / in_proj_z
    / in_proj_b / in_proj_a as attn_qkv / attn_gate / ssm_beta / ssm_alpha, with every value-head-indexed tensor
    reordered from grouped to tiled (tiled_v_heads; not when key and value heads are as many), the fused experts'
    gate_up_proj split into gate and up, rope.dimension_sections written (interleaved MRoPE, one position for
    text)."""
    t = cfg.get("text_config", cfg)
    hd, partial, theta, hk, hv, dk, dv = gdn_shape(t)
    r = hv // hk
    moe = arch == "qwen35moe"
    a = arch + "."
    n_rot = int(hd * partial)
    half = n_rot // 2
    L = t["num_hidden_layers"]
    types = t.get("layer_types") or ["full_attention" if (i + 1) % t.get("full_attention_interval", 4) == 0
                                     else "linear_attention" for i in range(L)]
    kvs = [("general.architecture", gw.STRING, arch, None),
           (a + "vocab_size", gw.U32, t["vocab_size"], None),
           (a + "context_length", gw.U32, t.get("max_position_embeddings", 4096), None),
           (a + "embedding_length", gw.U32, t["hidden_size"], None),
           (a + "block_count", gw.U32, L, None),
           (a + "attention.head_count", gw.U32, t["num_attention_heads"], None),
           (a + "attention.head_count_kv", gw.U32, t["num_key_value_heads"], None),
           (a + "attention.key_length", gw.U32, hd, None), (a + "attention.value_length", gw.U32, hd, None),
           (a + "attention.layer_norm_rms_epsilon", gw.F32, t.get("rms_norm_eps", 1e-6), None),
           (a + "rope.dimension_count", gw.U32, n_rot, None),
           (a + "rope.dimension_sections", gw.ARRAY, None, (gw.I32, [half - 2 * (half // 3), half // 3, half // 3, 0])),
           (a + "rope.freq_base", gw.F32, theta, None),
           (a + "ssm.conv_kernel", gw.U32, t["linear_conv_kernel_dim"], None),
           (a + "ssm.state_size", gw.U32, dk, None), (a + "ssm.group_count", gw.U32, hk, None),
           (a + "ssm.time_step_rank", gw.U32, hv, None), (a + "ssm.inner_size", gw.U32, dv * hv, None),
           (a + "attention.recurrent_layers", gw.ARRAY, None, (gw.BOOL, [ty == "linear_attention" for ty in types]))]
    if moe:
        kvs += [(a + "expert_feed_forward_length", gw.U32, t["moe_intermediate_size"], None),
                (a + "expert_shared_feed_forward_length", gw.U32, t.get("shared_expert_intermediate_size", 0), None),
                (a + "expert_count", gw.U32, t["num_experts"], None),
                (a + "expert_used_count", gw.U32, t["num_experts_per_tok"], None)]
    else:
        kvs.append((a + "feed_forward_length", gw.U32, t["intermediate_size"], None))
    P = "model.language_model."
    tied = t.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    tile = (lambda x, dim, width: tiled_v_heads(x, dim, hk, r, width)) if r > 1 else (lambda x, dim, width: x)
    out = [("token_embd.weight", tensors[P + "embed_tokens.weight"]),
           ("output_norm.weight", tensors[P + "norm.weight"].float() + 1)]
    if not tied:
        out.append(("output.weight", tensors["lm_head.weight"]))
    for l in range(L):
        h, b = f"{P}layers.{l}.", f"blk.{l}."
        g = lambda n: tensors[h + n]
        out += [(b + "attn_norm.weight", g("input_layernorm.weight").float() + 1),
                (b + "post_attention_norm.weight", g("post_attention_layernorm.weight").float() + 1)]
        if types[l] == "linear_attention":
            qkv = g("linear_attn.in_proj_qkv.weight")
            qk = 2 * hk * dk
            conv = g("linear_attn.conv1d.weight").squeeze(1)
            out += [(b + "attn_qkv.weight", torch.cat([qkv[:qk], tile(qkv[qk:], 0, dv)])),
                    (b + "attn_gate.weight", tile(g("linear_attn.in_proj_z.weight"), 0, dv)),
                    (b + "ssm_beta.weight", tile(g("linear_attn.in_proj_b.weight"), 0, 1)),
                    (b + "ssm_alpha.weight", tile(g("linear_attn.in_proj_a.weight"), 0, 1)),
                    (b + "ssm_conv1d.weight", torch.cat([conv[:qk], tile(conv[qk:], 0, dv)])),
                    (b + "ssm_dt.bias", tile(g("linear_attn.dt_bias"), 0, 1)),
                    (b + "ssm_a", tile(-torch.exp(g("linear_attn.A_log").float()), 0, 1)),
                    (b + "ssm_norm.weight", g("linear_attn.norm.weight")),
                    (b + "ssm_out.weight", tile(g("linear_attn.out_proj.weight"), 1, dv))]
        else:
            out += [(b + f"attn_{p}.weight", g(f"self_attn.{p}_proj.weight")) for p in "qkv"]
            out += [(b + "attn_output.weight", g("self_attn.o_proj.weight")),
                    (b + "attn_q_norm.weight", g("self_attn.q_norm.weight").float() + 1),
                    (b + "attn_k_norm.weight", g("self_attn.k_norm.weight").float() + 1)]
        if not moe:
            out += [(b + f"ffn_{p}.weight", g(f"mlp.{p}_proj.weight")) for p in ("gate", "up", "down")]
            continue
        gate_up = g("mlp.experts.gate_up_proj")
        n_ff = gate_up.shape[-2] // 2
        out += [(b + "ffn_gate_inp.weight", g("mlp.gate.weight")),
                (b + "ffn_gate_exps.weight", gate_up[:, :n_ff]), (b + "ffn_up_exps.weight", gate_up[:, n_ff:]),
                (b + "ffn_down_exps.weight", g("mlp.experts.down_proj"))]
        if h + "mlp.shared_expert_gate.weight" in tensors:
            out.append((b + "ffn_gate_inp_shexp.weight", g("mlp.shared_expert_gate.weight").reshape(-1)))
            out += [(b + f"ffn_{p}_shexp.weight", g(f"mlp.shared_expert.{p}_proj.weight")) for p in ("gate", "up", "down")]
    return kvs, out


def _kimi_dims(cfg: dict):
    """(L, H, nope, rope, v, lora, full): layers, heads, the MLA's head dims and latent, the one-based MLA layers."""
    return (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
            cfg["v_head_dim"], cfg["kv_lora_rank"], set(cfg["linear_attn_config"]["full_attn_layers"]))


def _kda_tensors(g, s: str, b: str, a_log: torch.Tensor) -> list:
    """A KDA layer's tensors but its output gate, as both Kimi converters write them (g: the layer's tensors by
    name, s: "self_attn.", b: "blk.N."): each short conv [C, 1, K] as [1, C, 1, K], ssm_a = -exp(A_log)."""
    out = []
    for c in "qkv":
        conv = g(s + f"{c}_conv1d.weight")
        out += [(b + f"ssm_conv1d_{c}.weight", conv.reshape(1, conv.shape[0], 1, conv.shape[-1])),
                (b + f"attn_{c}.weight", g(s + f"{c}_proj.weight"))]
    return out + [(b + "ssm_f_a.weight", g(s + "f_a_proj.weight")), (b + "ssm_f_b.weight", g(s + "f_b_proj.weight")),
                  (b + "ssm_beta.weight", g(s + "b_proj.weight")), (b + "ssm_a", -torch.exp(a_log)),
                  (b + "ssm_dt.bias", g(s + "dt_bias")), (b + "ssm_norm.weight", g(s + "o_norm.weight")),
                  (b + "attn_output.weight", g(s + "o_proj.weight"))]


def _kimi_kvs(cfg: dict, a: str) -> list:
    """The keys conversion/kimi_linear.py and kimi_k3.py both write for the MLA (as MQA over its latent), the
    KDA and the sigmoid-routed MoE of a Kimi config (a = "ARCH.")."""
    la = cfg["linear_attn_config"]
    nope, rope, v, lora = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    return [(a + "embedding_length", gw.U32, cfg["hidden_size"], None),
            (a + "block_count", gw.U32, cfg["num_hidden_layers"], None),
            (a + "feed_forward_length", gw.U32, cfg["intermediate_size"], None),
            (a + "attention.head_count", gw.U32, cfg["num_attention_heads"], None),
            (a + "attention.layer_norm_rms_epsilon", gw.F32, cfg.get("rms_norm_eps", 1e-5), None),
            (a + "rope.dimension_count", gw.U32, rope, None),
            (a + "attention.kv_lora_rank", gw.U32, lora, None),
            (a + "attention.key_length", gw.U32, lora + rope, None),
            (a + "attention.value_length", gw.U32, lora, None),
            (a + "attention.key_length_mla", gw.U32, nope + rope, None),
            (a + "attention.value_length_mla", gw.U32, v, None),
            (a + "ssm.conv_kernel", gw.U32, la.get("short_conv_kernel_size", 4), None),
            (a + "kda.head_dim", gw.U32, la["head_dim"], None),
            (a + "expert_count", gw.U32, cfg["num_experts"], None),
            (a + "expert_used_count", gw.U32, cfg["num_experts_per_token"], None),
            (a + "expert_gating_func", gw.U32, 2, None),  # sigmoid
            (a + "expert_feed_forward_length", gw.U32, cfg["moe_intermediate_size"], None),
            (a + "expert_shared_count", gw.U32, cfg.get("num_shared_experts", 0), None),
            (a + "leading_dense_block_count", gw.U32, cfg.get("first_k_dense_replace", 0), None),
            (a + "expert_weights_scale", gw.F32, cfg.get("routed_scaling_factor", 1.0), None),
            (a + "expert_weights_norm", gw.BOOL, cfg.get("moe_renormalize", True), None)]


def kimi_linear(cfg: dict, tensors: dict, arch: str):
    """Kimi Linear as the converter writes it (conversion/kimi_linear.py): num_key_value_heads forced to 1 (the
    MLA as MQA over its latent; head_count_kv 0 on the KDA layers), A_log as -exp(A_log), dt_bias as ssm_dt.bias,
    each short conv [C, 1, K] as [1, C, 1, K], kv_b_proj split per head into k_b (transposed) and v_b, the experts
    (w1 gate, w2 down, w3 up) stacked. Returns (kvs, [(name, tensor)])."""
    L, H, nope, rope, v, lora, full = _kimi_dims(cfg)
    a = arch + "."
    kvs = [("general.architecture", gw.STRING, arch, None),
           (a + "vocab_size", gw.U32, cfg["vocab_size"], None),
           (a + "context_length", gw.U32, cfg.get("model_max_length", 4096), None),
           (a + "attention.head_count_kv", gw.ARRAY, None, (gw.U32, [1 if i + 1 in full else 0 for i in range(L)])),
           (a + "rope.freq_base", gw.F32, cfg.get("rope_theta", 10000.0), None),
           (a + "expert_group_count", gw.U32, cfg.get("num_expert_group", 1), None),
           (a + "expert_group_used_count", gw.U32, cfg.get("topk_group", 1), None)] + _kimi_kvs(cfg, a)
    out = [("token_embd.weight", tensors["model.embed_tokens.weight"]),
           ("output_norm.weight", tensors["model.norm.weight"])]
    if not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", tensors["lm_head.weight"]))
    for l in range(L):
        h, b = f"model.layers.{l}.", f"blk.{l}."
        g = lambda n: tensors[h + n]
        out += [(b + "attn_norm.weight", g("input_layernorm.weight")), (b + "ffn_norm.weight", g("post_attention_layernorm.weight"))]
        s = "self_attn."
        if l + 1 in full:
            kv_b = g(s + "kv_b_proj.weight").reshape(H, nope + v, lora)
            out += [(b + "attn_q.weight", g(s + "q_proj.weight")),
                    (b + "attn_kv_a_mqa.weight", g(s + "kv_a_proj_with_mqa.weight")),
                    (b + "attn_kv_a_norm.weight", g(s + "kv_a_layernorm.weight")),
                    (b + "attn_k_b.weight", kv_b[:, :nope].transpose(1, 2)), (b + "attn_v_b.weight", kv_b[:, nope:]),
                    (b + "attn_output.weight", g(s + "o_proj.weight"))]
        else:
            out += _kda_tensors(g, s, b, g(s + "A_log").float())
            out += [(b + "ssm_g_a.weight", g(s + "g_a_proj.weight")), (b + "ssm_g_b.weight", g(s + "g_b_proj.weight"))]
        if h + "block_sparse_moe.gate.weight" not in tensors:
            out += [(b + f"ffn_{p}.weight", g(f"mlp.{p}_proj.weight")) for p in ("gate", "up", "down")]
            continue
        m = "block_sparse_moe."
        E = cfg["num_experts"]
        out += [(b + "ffn_gate_inp.weight", g(m + "gate.weight")),
                (b + "exp_probs_b.bias", g(m + "gate.e_score_correction_bias"))]
        out += [(b + f"ffn_{p}_exps.weight", torch.stack([g(f"{m}experts.{e}.{w}.weight") for e in range(E)]))
                for p, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))]
        if h + m + "shared_experts.gate_proj.weight" in tensors:
            out += [(b + f"ffn_{p}_shexp.weight", g(f"{m}shared_experts.{p}_proj.weight")) for p in ("gate", "up", "down")]
    return kvs, out


def mxfp4_blocks(packed: torch.Tensor, scale: torch.Tensor) -> bytes:
    """compressed-tensors MXFP4 (codes [rows, cols / 2], column c in byte c / 2, the low nibble the even column;
    E8M0 exponents [rows, cols / 32]) as GGUF's MXFP4 blocks: per 32 columns the exponent byte, then 16 bytes with
    value j in the low nibble of byte j and value j + 16 in its high nibble (kv[u] 2^(e - 128), kv the doubled
    e2m1 values: the same numbers)."""
    p = packed.to(torch.uint8).numpy()
    rows, cols = p.shape[0], 2 * p.shape[1]
    codes = np.empty((rows, cols), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = p & 15, p >> 4
    codes = codes.reshape(rows, cols // 32, 32)
    qs = codes[:, :, :16] | (codes[:, :, 16:] << 4)
    e = scale.to(torch.uint8).numpy().reshape(rows, cols // 32, 1)
    return np.concatenate([e, qs], axis=2).tobytes()


def kimi_k3(cfg: dict, tensors: dict, arch: str):
    """Kimi K3 as conversion/kimi_k3.py writes it: the text model (text_config; tensors without "language_model.",
    no vision), Kimi Linear's conventions (MLA as MQA, head_count_kv 0 on KDA layers, -exp(A_log) of the first
    num_attention_heads entries, dt_bias as ssm_dt.bias, convs [1, C, 1, K], kv_b split, experts stacked), plus
    q_a / q_a_norm / q_b, g_proj as ssm_g (KDA) or attn_gate (MLA), the latent MoE's ffn_routed_{down,up,norm},
    each AttnRes pair fused into norm * proj (attn_res_score, ffn_res_score, output_res_score) and MXFP4 experts
    repacked into GGUF's MXFP4 blocks. Returns (kvs, [(name, tensor or (ne, type, bytes))])."""
    text = cfg.get("text_config", cfg)
    tensors = {k.removeprefix("language_model."): v for k, v in tensors.items()
               if not k.startswith(("vision_tower.", "mm_projector."))}
    la = text["linear_attn_config"]
    L, H, nope, rope, v, lora, full = _kimi_dims(text)
    E = text["num_experts"]
    a = arch + "."
    kvs = [("general.architecture", gw.STRING, arch, None),
           (a + "vocab_size", gw.U32, text["vocab_size"], None),
           (a + "context_length", gw.U32, text.get("max_position_embeddings", 4096), None),
           (a + "attention.head_count_kv", gw.ARRAY, None, (gw.I32, [1 if i + 1 in full else 0 for i in range(L)])),
           (a + "activation.situ_beta", gw.F32, text["activation_situ_beta"], None),
           (a + "activation.situ_linear_beta", gw.F32, text.get("activation_situ_linear_beta") or 0.0, None),
           (a + "attn_res.block_size", gw.U32, text["attn_res_block_size"], None)] + _kimi_kvs(text, a)
    if text.get("q_lora_rank"):
        kvs.append((a + "attention.q_lora_rank", gw.U32, text["q_lora_rank"], None))
    if la.get("gate_lower_bound") is not None:
        kvs.append((a + "kda.gate_lower_bound", gw.F32, la["gate_lower_bound"], None))
    if text.get("routed_expert_hidden_size"):
        kvs.append((a + "expert_latent_length", gw.U32, text["routed_expert_hidden_size"], None))
    if text.get("num_expert_group", 1) > 1:  # (llama.cpp's converter looks for n_group / topk_group, which K3 lacks)
        kvs += [(a + "expert_group_count", gw.U32, text["num_expert_group"], None),
                (a + "expert_group_used_count", gw.U32, text["topk_group"], None)]

    def fused(prefix: str) -> torch.Tensor:
        return tensors[prefix + "_norm.weight"].float().flatten() * tensors[prefix + "_proj.weight"].float().flatten()

    out = [("token_embd.weight", tensors["model.embed_tokens.weight"]),
           ("output_norm.weight", tensors["model.norm.weight"]),
           ("output.weight", tensors["lm_head.weight"]),
           ("output_res_score.weight", fused("model.output_attn_res"))]
    for l in range(L):
        h, b = f"model.layers.{l}.", f"blk.{l}."
        g = lambda n: tensors[h + n]
        s = "self_attn."
        out += [(b + "attn_norm.weight", g("input_layernorm.weight")), (b + "ffn_norm.weight", g("post_attention_layernorm.weight")),
                (b + "attn_res_score.weight", fused(h + "self_attention_res")), (b + "ffn_res_score.weight", fused(h + "mlp_res"))]
        if l + 1 in full:
            kv_b = g(s + "kv_b_proj.weight").reshape(H, nope + v, lora)
            if h + s + "q_a_proj.weight" in tensors:
                out += [(b + "attn_q_a.weight", g(s + "q_a_proj.weight")), (b + "attn_q_a_norm.weight", g(s + "q_a_layernorm.weight")),
                        (b + "attn_q_b.weight", g(s + "q_b_proj.weight"))]
            else:
                out.append((b + "attn_q.weight", g(s + "q_proj.weight")))
            out += [(b + "attn_kv_a_mqa.weight", g(s + "kv_a_proj_with_mqa.weight")),
                    (b + "attn_kv_a_norm.weight", g(s + "kv_a_layernorm.weight")),
                    (b + "attn_k_b.weight", kv_b[:, :nope].transpose(1, 2)), (b + "attn_v_b.weight", kv_b[:, nope:]),
                    (b + "attn_output.weight", g(s + "o_proj.weight"))]
            if h + s + "g_proj.weight" in tensors:
                out.append((b + "attn_gate.weight", g(s + "g_proj.weight")))
        else:
            out += _kda_tensors(g, s, b, g(s + "A_log").float().flatten()[:H])
            if h + s + "g_proj.weight" in tensors:  # the full-rank gate; a low-rank pair as Kimi Linear's
                out.append((b + "ssm_g.weight", g(s + "g_proj.weight")))
            else:
                out += [(b + "ssm_g_a.weight", g(s + "g_a_proj.weight")), (b + "ssm_g_b.weight", g(s + "g_b_proj.weight"))]
        if h + "block_sparse_moe.gate.weight" not in tensors:
            out += [(b + f"ffn_{p}.weight", g(f"mlp.{p}_proj.weight")) for p in ("gate", "up", "down")]
            continue
        m = "block_sparse_moe."
        out += [(b + "ffn_gate_inp.weight", g(m + "gate.weight")),
                (b + "exp_probs_b.bias", g(m + "gate.e_score_correction_bias"))]
        for p, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            first = f"{h}{m}experts.0.{w}.weight"
            if first + "_packed" in tensors:
                rows, cols = tensors[first + "_packed"].shape[0], 2 * tensors[first + "_packed"].shape[1]
                blob = b"".join(mxfp4_blocks(g(f"{m}experts.{e}.{w}.weight_packed"), g(f"{m}experts.{e}.{w}.weight_scale"))
                                for e in range(E))
                out.append((b + f"ffn_{p}_exps.weight", ([cols, rows, E], 39, blob)))
            else:
                out.append((b + f"ffn_{p}_exps.weight", torch.stack([g(f"{m}experts.{e}.{w}.weight") for e in range(E)])))
        if h + m + "routed_expert_down_proj.weight" in tensors:
            out += [(b + "ffn_routed_down.weight", g(m + "routed_expert_down_proj.weight")),
                    (b + "ffn_routed_up.weight", g(m + "routed_expert_up_proj.weight"))]
            if h + m + "routed_expert_norm.weight" in tensors:
                out.append((b + "ffn_routed_norm.weight", g(m + "routed_expert_norm.weight")))
        if h + m + "shared_experts.gate_proj.weight" in tensors:
            out += [(b + f"ffn_{p}_shexp.weight", g(f"{m}shared_experts.{p}_proj.weight")) for p in ("gate", "up", "down")]
    return kvs, out


def mirror(src: str, out: str, extra_tensor=None, arch="gpt2", pre="gpt-2", type_of=None, drop_key=None, alignment=32,
           split=1):
    cfg = json.load(open(os.path.join(src, "config.json")))
    tensors = read_checkpoint(src)
    family = cfg.get("model_type")
    if family == "kimi_linear" and "attn_res_block_size" in cfg:
        family = "kimi_k3"  # K3's fields in a KimiLinearForCausalLM config
    if family in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "kimi_linear", "kimi_k3"):
        default = {"qwen3_next": "qwen3next", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe",
                   "kimi_linear": "kimi-linear", "kimi_k3": "kimi-k3"}[family]
        build = {"qwen3_next": qwen3_next, "kimi_linear": kimi_linear, "kimi_k3": kimi_k3}.get(family, qwen3_5)
        kvs, named = build(cfg, tensors, default if arch == "gpt2" else arch)
        kvs.append(("tokenizer.ggml.model", gw.STRING, "no_vocab", None))
        if alignment != 32:
            kvs.append(("general.alignment", gw.U32, alignment, None))
        kvs = [kv for kv in kvs if kv[0] != drop_key]
        out_tensors = []
        for name, t in named:
            if isinstance(t, tuple):  # already in a block format: (ne, type, bytes)
                out_tensors.append((name,) + t)
                continue
            if t.dim() == 1:
                t = t.float()
            t = t.contiguous()
            out_tensors.append((name, list(reversed(t.shape)), GGML_OF[t.dtype], raw(t)))
        gw.write(out, kvs, out_tensors, alignment=alignment)
        return
    # llama.cpp's gpt2 has no keys for these: it always runs GELU's tanh form, scaled attention, no convolution.
    if cfg.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise SystemExit(f"{src}: activation {cfg['activation_function']}: llama.cpp's gpt2 runs only GELU (tanh)")
    if not cfg.get("scale_attn_weights", True) or cfg.get("conv_size"):
        raise SystemExit(f"{src}: llama.cpp's gpt2 has no unscaled attention and no convolution")
    tied = cfg.get("tie_word_embeddings", True)
    d = cfg.get("n_embd", 768)
    kvs = [("general.architecture", gw.STRING, arch, None), ("general.name", gw.STRING, os.path.basename(src), None),
           ("gpt2.vocab_size", gw.U32, cfg.get("vocab_size", 50257), None),
           ("gpt2.context_length", gw.U32, cfg.get("n_positions", 1024), None),
           ("gpt2.embedding_length", gw.U32, d, None),
           ("gpt2.feed_forward_length", gw.U32, cfg.get("n_inner") or 4 * d, None),
           ("gpt2.block_count", gw.U32, cfg.get("n_layer", 12), None),
           ("gpt2.attention.head_count", gw.U32, cfg.get("n_head", 12), None),
           ("gpt2.attention.layer_norm_epsilon", gw.F32, cfg.get("layer_norm_epsilon", 1e-5), None)]
    vocab, merges = os.path.join(src, "vocab.json"), os.path.join(src, "merges.txt")
    if os.path.exists(vocab) and os.path.exists(merges):
        ids = json.load(open(vocab, encoding="utf-8"))
        tokens = [None] * len(ids)
        for piece, i in ids.items():
            tokens[i] = piece
        lines = [ln for ln in open(merges, encoding="utf-8").read().split("\n") if ln and not ln.startswith("#version")]
        eot = ids.get("<|endoftext|>")
        types = [3 if i == eot else 1 for i in range(len(tokens))]
        kvs += [("tokenizer.ggml.model", gw.STRING, "gpt2", None), ("tokenizer.ggml.pre", gw.STRING, pre, None),
                ("tokenizer.ggml.tokens", gw.ARRAY, None, (gw.STRING, tokens)),
                ("tokenizer.ggml.token_type", gw.ARRAY, None, (gw.I32, types)),
                ("tokenizer.ggml.merges", gw.ARRAY, None, (gw.STRING, lines))]
        if eot is not None:
            kvs += [(f"tokenizer.ggml.{k}_token_id", gw.U32, eot, None) for k in ("bos", "eos")]
    else:
        kvs.append(("tokenizer.ggml.model", gw.STRING, "no_vocab", None))
    # The chat template, as the converter copies it: chat_template.jinja, else tokenizer_config.json's.
    jinja, tok_cfg = os.path.join(src, "chat_template.jinja"), os.path.join(src, "tokenizer_config.json")
    template = open(jinja, encoding="utf-8").read() if os.path.exists(jinja) else \
        json.load(open(tok_cfg, encoding="utf-8")).get("chat_template") if os.path.exists(tok_cfg) else None
    if isinstance(template, str):
        kvs.append(("tokenizer.chat_template", gw.STRING, template, None))
    if alignment != 32:
        kvs.append(("general.alignment", gw.U32, alignment, None))
    kvs = [kv for kv in kvs if kv[0] != drop_key]
    out_tensors = []
    for name, t in tensors.items():
        g = gguf_name(name)
        if g is None or (g == "output.weight" and tied):
            continue
        if name.endswith(CONV1D):
            t = t.t()  # Conv1D's [in, out] -> [out, in]
        if t.dim() == 1:
            t = t.float()  # the converter writes 1-D tensors (norms, biases) as F32 whatever the file type
        gt = GGML_OF[t.dtype]
        blob = raw(t)
        if type_of and type_of[0] == g:
            gt = type_of[1]
            block, nbytes = gw.GGML[gt]
            blob = bytes(t.numel() // block * nbytes)
        out_tensors.append((g, list(reversed(t.shape)), gt, blob))
    if extra_tensor:
        out_tensors.append((extra_tensor, [d], 0, np.zeros(d, dtype=np.float32).tobytes()))
    if split == 1:
        gw.write(out, kvs, out_tensors, alignment=alignment)
        return
    # As llama.cpp's gguf-split writes a model in `split` files: PREFIX-0000k-of-0000N.gguf, the tensors in order,
    # the metadata in the first, and split.no / split.count / split.tensors.count in each.
    assert out.endswith(".gguf")
    prefix = out[:-len(".gguf")]
    per = -(-len(out_tensors) // split)
    for k in range(split):
        keys = [("split.no", gw.U16, k, None), ("split.count", gw.U16, split, None),
                ("split.tensors.count", gw.I32, len(out_tensors), None)]
        if alignment != 32 and k > 0:  # (the first file has it among kvs)
            keys.append(("general.alignment", gw.U32, alignment, None))
        gw.write(f"{prefix}-{k + 1:05d}-of-{split:05d}.gguf", (kvs if k == 0 else []) + keys,
                 out_tensors[k * per:(k + 1) * per], alignment=alignment)


_BYTE_TABLE = [byte_to_unicode()[x] for x in range(256)]


def byte_level(b: bytes) -> str:
    """GPT-2's byte-to-unicode spelling of raw bytes (what the converters write for tiktoken vocabularies)."""
    return "".join(_BYTE_TABLE[x] for x in b)


def tiktoken_merge(ranks: dict, token: bytes, max_rank: int) -> list:
    """The pieces tiktoken's byte-pair merge leaves of `token` using only ranks below max_rank: a token of two
    pieces is the merge of those two (the converters' derivation of merges from a rank table)."""
    parts = [bytes([x]) for x in token]
    while True:
        best, at = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            return parts
        parts = parts[:at] + [parts[at] + parts[at + 1]] + parts[at + 2:]


def kimi_vocab(tokdir: str):
    """Kimi's tiktoken.model + tokenizer_config.json as conversion/kimi_linear.py writes them: model "gpt2", pre
    "kimi-k2", each rank as its byte-level spelling, the merges derived from the ranks, the 256 special tokens
    after the ranks (named by added_tokens_decoder, else <|reserved_token_ID|>) as control tokens, bos / eos."""
    import base64
    ranks = {}
    for line in open(os.path.join(tokdir, "tiktoken.model"), "rb").read().split(b"\n"):
        if line.strip():
            b64, r = line.split()
            ranks[base64.b64decode(b64)] = int(r)
    n = len(ranks)
    cfg = json.load(open(os.path.join(tokdir, "tokenizer_config.json"), encoding="utf-8"))
    named = {int(i): t["content"] for i, t in cfg.get("added_tokens_decoder", {}).items()}
    tokens, types, merges = [None] * (n + 256), [1] * (n + 256), []
    for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[r] = byte_level(tok)
        if len(tok) > 1:
            # Where only one split of the token has both halves in the table below its rank, that split is
            # the merge; otherwise tiktoken's merge decides (the same result, found faster).
            splits = [(tok[:i], tok[i:]) for i in range(1, len(tok))
                      if ranks.get(tok[:i], r) < r and ranks.get(tok[i:], r) < r]
            pieces = list(splits[0]) if len(splits) == 1 else tiktoken_merge(ranks, tok, r)
            if len(pieces) == 2:
                merges.append(byte_level(pieces[0]) + " " + byte_level(pieces[1]))
    for i in range(n, n + 256):
        tokens[i], types[i] = named.get(i, f"<|reserved_token_{i}|>"), 3
    ids = {t: i for i, t in enumerate(tokens)}
    special = lambda key: (cfg.get(key) or {}).get("content") if isinstance(cfg.get(key), dict) else cfg.get(key)
    kvs = [("tokenizer.ggml.model", gw.STRING, "gpt2", None), ("tokenizer.ggml.pre", gw.STRING, "kimi-k2", None),
           ("tokenizer.ggml.tokens", gw.ARRAY, None, (gw.STRING, tokens)),
           ("tokenizer.ggml.token_type", gw.ARRAY, None, (gw.I32, types)),
           ("tokenizer.ggml.merges", gw.ARRAY, None, (gw.STRING, merges))]
    for key, name in (("bos_token", "bos"), ("eos_token", "eos")):
        if special(key) in ids:
            kvs.append((f"tokenizer.ggml.{name}_token_id", gw.U32, ids[special(key)], None))
    return kvs


def parse(args):
    src, out = args[0], args[1]
    kw = {}
    i = 2
    while i < len(args):
        k, v = args[i], args[i + 1]
        if k == "--extra-tensor":
            kw["extra_tensor"] = v
        elif k == "--arch":
            kw["arch"] = v
        elif k == "--pre":
            kw["pre"] = v
        elif k == "--type-of":
            name, gid = v.split("=")
            kw["type_of"] = (name, int(gid))
        elif k == "--alignment":
            kw["alignment"] = int(v)
        elif k == "--split":
            kw["split"] = int(v)
        elif k == "--drop-key":
            kw["drop_key"] = v
        else:
            raise SystemExit(f"unknown option {k}")
        i += 2
    return src, out, kw


def main() -> int:
    # A vocabulary-only file (as llama.cpp's ggml-vocab-*.gguf): --vocab-only TOKENIZER_DIR OUT.gguf (Kimi's
    # tiktoken.model directory).
    if sys.argv[1:2] == ["--vocab-only"]:
        gw.write(sys.argv[3], [("general.architecture", gw.STRING, "kimi-linear", None)] + kimi_vocab(sys.argv[2]), [])
        return 0
    # Several mirrors in one run (one interpreter start): their argument lists separated by "--next".
    job = []
    for a in sys.argv[1:] + ["--next"]:
        if a != "--next":
            job.append(a)
            continue
        if job:
            src, out, kw = parse(job)
            mirror(src, out, **kw)
        job = []
    return 0


if __name__ == "__main__":
    sys.exit(main())
