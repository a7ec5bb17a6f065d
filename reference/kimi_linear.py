"""Kimi-Linear (model_type "kimi_linear", KimiLinearForCausalLM) forward in plain PyTorch, written from
/work/shared/spec/attention-mla-moe-attnres.md sections 2, 3 and 7 and linear-attention-family.md
section 5 (5A, 5B). The golden reference for the C++ kimi_linear path: it runs in the dtype of the weights
it is given (float64 for goldens) and records every named intermediate (intermediate_shapes is the
contract).

Block (every layer i, zero-based): h += mixer(input_layernorm(h)); h += ffn(post_attention_layernorm(h));
then model.norm and an untied lm_head (tie_word_embeddings true reads model.embed_tokens instead).
RMSNorms use rms_norm_eps, except MLA's kv_a_layernorm, which is built without it in the released code
and so uses 1e-6 (spec 2.3).

* Mixer: KDA where (i+1) is in linear_attn_config.kda_layers, MLA where (i+1) is in full_attn_layers
  (the lists are 1-based).
  - KDA (spec 5B; names q_proj/k_proj/v_proj, {q,k,v}_conv1d, A_log [1,1,H,1], dt_bias [H*K],
    f_a_proj/f_b_proj, b_proj, g_a_proj/g_b_proj without bias, o_norm, o_proj): fla's KDA with K = V =
    head_dim, no GVA, beta = sigmoid(b_proj x) (never x2), log decay -exp(A_log[h]) softplus(f + dt_bias),
    the naive token-by-token recurrence of delta_family.py, output RMSNorm(o) * sigmoid(g_b(g_a(x))).
    (kda_mixer takes the decay and the output gate as functions: Kimi K3 swaps both.)
    The building blocks (short conv, l2 norm, softplus, recurrence, RMSNorm) are delta_family.py's.
  - MLA (spec 2.3): q = q_proj x (q_lora_rank must be null), [c ; k_r] = kv_a_proj_with_mqa x,
    c^ = kv_a_layernorm(c) (the cached latent), [k_n,h ; v_h] = kv_b_proj c^ (head-major), K_h =
    [k_n,h ; k_r] with k_r shared by all heads, scale (d_n + d_r)^-1/2, a full materialized causal
    softmax, o_proj. mla_form "explicit" (default, the golden) expands K and V; "absorbed" (spec 2.4)
    scores q~_h = W_UK,h^T q_n,h against the latents, attends in latent space and applies W_UV,h after:
    the decode form, the same function to rounding.
    mla_use_nope true (every released Kimi checkpoint): no rotation. LINEAGE EXTENSION, not in any
    released Kimi model: mla_use_nope false applies DeepSeek-V3's interleaved RoPE to the d_r slot of q
    and to k_r, pairs (x_2i, x_2i+1) rotated by the angle pos * rope_theta^(-2i/d_r) at absolute position
    pos, (x_2i, x_2i+1) -> (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos), results kept in that
    interleaved layout (DeepSeek's complex-pair form; HF's rope_interleave permutes to half-split
    first, a permutation of both q_r and k_r that leaves every score unchanged). rope_scaling must be
    null.
* FFN: dense SwiGLU mlp.{gate,up,down}_proj of intermediate_size where i < first_k_dense_replace or
  i % moe_layer_freq != 0 (or num_experts null); else the MoE of spec 3.2/3.3 (route below): experts
  block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down), plus the shared experts (one SwiGLU of
  width moe_intermediate_size * num_shared_experts, unweighted; absent when num_shared_experts is 0 or
  null).
* Router (route): logits = W_gate x in the compute dtype; s = sigmoid(logits); s' = s + e_score_correction
  _bias (selection only); with num_expert_group > 1 the group score is the sum of the top-2 s' of its
  experts, the topk_group best groups are kept (ties: lower group index first) and s' of every other
  group's experts is set to 0.0 (HF DS-V3 / Kimi-Linear's mask, not -inf; KimiConfig.group_mask, -inf
  for Kimi K3); the k experts are the top-k
  of that masked s' with deterministic ties (larger first, then lower expert index), listed in that
  order; weights w = s[idx] (unbiased); if k > 1 and moe_renormalize, w /= (sum w + 1e-20); then
  w *= routed_scaling_factor. LINEAGE OPTION router_bias_in_weights (config.json, default false): the
  released modeling_kimi.py adds the bias in place into a view of `scores` and gathers the weights from
  `scores`, so the weights are the biased s' = s + b at the selected experts (taken before the group
  mask, which the released code applies to a copy: a selected expert of a masked group keeps s + b,
  not 0.0); it changes only the weights, never the selection.

With bf16_inputs (delta_family.bf16_weight_names of the checkpoint) every Linear on a BF16 weight takes
its input rounded to bf16 (the engine's default bf16 dot products): q/k/v/o, b_proj, both halves of the
f and g low-rank pairs (the middle activation rounded too), MLA q_proj, kv_a_proj_with_mqa, kv_b_proj
(its input is the latent c^, explicit form only), o_proj, every expert and shared-expert projection, the
dense MLP and the head; not the router gate, which runs in float32 whatever its dtype (HF casts both x
and the weight to float32; so does the engine). Embedding lookups, convs, A_log, dt_bias, norm weights and
e_score_correction_bias are not linears."""

import math
from dataclasses import dataclass
from typing import Optional

import torch

from delta_family import (Weights, bf16_weight_names, gated_delta_recurrent, l2_normalize, rms_norm,  # noqa: F401
                          short_conv, silu, softplus)
from golden_io import recorder

MODEL_TYPE = "kimi_linear"
ARCHITECTURE = "KimiLinearForCausalLM"
MLA_NORM_EPS = 1e-6        # KimiRMSNorm(kv_lora_rank): the class default, not rms_norm_eps (spec 2.3)
RENORM_EPS = 1e-20         # w / (sum w + 1e-20) (spec 3.2)

# config.json fields the forward reads (the published 48B config's names); absent ones raise.
_REQUIRED = (
    "vocab_size", "hidden_size", "num_hidden_layers", "rms_norm_eps", "tie_word_embeddings", "hidden_act",
    "intermediate_size", "first_k_dense_replace", "moe_layer_freq", "num_experts", "num_experts_per_token",
    "moe_intermediate_size", "num_shared_experts", "moe_renormalize", "moe_router_activation_func",
    "routed_scaling_factor", "use_grouped_topk", "num_expert_group", "topk_group", "num_attention_heads",
    "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "mla_use_nope", "rope_theta", "rope_scaling", "linear_attn_config",
)
_REQUIRED_LINEAR = ("kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size")


@dataclass(frozen=True)
class KimiConfig:
    """The config.json fields the forward depends on (Kimi's names; the linear_attn_config ones prefixed
    kda_). Build it with from_json."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    intermediate_size: int
    first_k_dense_replace: int
    moe_layer_freq: int
    num_experts: Optional[int]
    num_experts_per_token: int
    moe_intermediate_size: int
    num_shared_experts: int
    moe_renormalize: bool
    routed_scaling_factor: float
    num_expert_group: int
    topk_group: int
    router_bias_in_weights: bool
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_use_nope: bool
    rope_theta: float
    kda_layers: tuple
    full_attn_layers: tuple
    kda_num_heads: int
    kda_head_dim: int
    conv_size: int
    kv_a_norm_eps: float = MLA_NORM_EPS  # not a config.json field: fixed by the released code (spec 2.3)
    hidden_act: str = "silu"              # or K3's "situ" (spec 5), with its two betas
    situ_beta: float = 4.0
    situ_linear_beta: Optional[float] = 25.0  # None: the up branch is not capped
    group_mask: float = 0.0               # s' of experts in dropped groups (K3: -inf); not a config.json field

    @classmethod
    def from_json(cls, d: dict) -> "KimiConfig":
        """config.json (dict) -> KimiConfig. Raises ValueError on a missing field or an option this
        reference does not implement."""
        def bad(field, found, expected):
            raise ValueError(f"config.json (kimi_linear): '{field}' is {found!r}, expected {expected}")
        if d.get("model_type") != MODEL_TYPE:
            bad("model_type", d.get("model_type"), repr(MODEL_TYPE))
        missing = [k for k in _REQUIRED if k not in d]
        lac = d.get("linear_attn_config") or {}
        missing += [f"linear_attn_config.{k}" for k in _REQUIRED_LINEAR if k not in lac]
        if missing:
            raise ValueError(f"config.json (kimi_linear): missing fields {missing}")
        if d["q_lora_rank"] is not None:
            bad("q_lora_rank", d["q_lora_rank"], "null (Kimi-Linear MLA has a single q_proj)")
        if d["hidden_act"] not in ("silu", "situ"):
            bad("hidden_act", d["hidden_act"], "'silu' or 'situ'")
        if d["moe_router_activation_func"] != "sigmoid":
            bad("moe_router_activation_func", d["moe_router_activation_func"], "'sigmoid'")
        if d["rope_scaling"] is not None:
            bad("rope_scaling", d["rope_scaling"], "null")
        if d["num_key_value_heads"] != d["num_attention_heads"]:
            bad("num_key_value_heads", d["num_key_value_heads"], f"num_attention_heads ({d['num_attention_heads']})")
        if d.get("mla_use_output_gate"):
            bad("mla_use_output_gate", d["mla_use_output_gate"], "absent or false (K3's gated MLA)")
        if d.get("num_nextn_predict_layers", 0):
            bad("num_nextn_predict_layers", d["num_nextn_predict_layers"], "0")
        groups = d["num_expert_group"] if d["num_expert_group"] is not None else 1
        if groups > 1 and not d["use_grouped_topk"]:
            bad("use_grouped_topk", False, "true when num_expert_group > 1")
        cfg = cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_hidden_layers=d["num_hidden_layers"],
            rms_norm_eps=float(d["rms_norm_eps"]), tie_word_embeddings=bool(d["tie_word_embeddings"]),
            intermediate_size=d["intermediate_size"], first_k_dense_replace=d["first_k_dense_replace"],
            moe_layer_freq=d["moe_layer_freq"], num_experts=d["num_experts"],
            num_experts_per_token=d["num_experts_per_token"], moe_intermediate_size=d["moe_intermediate_size"],
            num_shared_experts=d["num_shared_experts"] or 0, moe_renormalize=bool(d["moe_renormalize"]),
            routed_scaling_factor=float(d["routed_scaling_factor"]), num_expert_group=groups,
            topk_group=d["topk_group"] if d["topk_group"] is not None else 1,
            router_bias_in_weights=bool(d.get("router_bias_in_weights", False)),
            num_attention_heads=d["num_attention_heads"], kv_lora_rank=d["kv_lora_rank"],
            qk_nope_head_dim=d["qk_nope_head_dim"], qk_rope_head_dim=d["qk_rope_head_dim"],
            v_head_dim=d["v_head_dim"], mla_use_nope=bool(d["mla_use_nope"]), rope_theta=float(d["rope_theta"]),
            kda_layers=tuple(lac["kda_layers"]), full_attn_layers=tuple(lac["full_attn_layers"]),
            kda_num_heads=lac["num_heads"], kda_head_dim=lac["head_dim"],
            conv_size=lac["short_conv_kernel_size"], hidden_act=d["hidden_act"],
            situ_beta=float(d.get("activation_situ_beta", 4.0)),
            situ_linear_beta=(None if "activation_situ_linear_beta" in d and d["activation_situ_linear_beta"] is None
                              else float(d.get("activation_situ_linear_beta", 25.0))))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def bad(field, found, expected):
            raise ValueError(f"config.json (kimi_linear): '{field}' is {found!r}, expected {expected}")
        L = self.num_hidden_layers
        kda, full = set(self.kda_layers), set(self.full_attn_layers)
        if kda & full or kda | full != set(range(1, L + 1)):
            bad("linear_attn_config.kda_layers/full_attn_layers", (self.kda_layers, self.full_attn_layers),
                f"disjoint 1-based lists covering 1..{L}")
        if self.moe_layer_freq < 1:
            bad("moe_layer_freq", self.moe_layer_freq, ">= 1")
        if not self.mla_use_nope and self.qk_rope_head_dim % 2:
            bad("qk_rope_head_dim", self.qk_rope_head_dim, "even (RoPE rotates pairs)")
        if self.num_experts is not None:
            E, G, k = self.num_experts, self.num_expert_group, self.num_experts_per_token
            if E % G or (G > 1 and E // G < 2):
                bad("num_expert_group", G, f"a divisor of num_experts {E} leaving >= 2 experts per group")
            if not 1 <= self.topk_group <= G:
                bad("topk_group", self.topk_group, f"1..{G}")
            if not 1 <= k <= E:  # k may exceed the kept groups' experts: the 0.0 mask lets masked ones in
                bad("num_experts_per_token", k, f"1..{E}")

    def layer_kind(self, i: int) -> str:
        """"kda" or "mla" for zero-based layer i."""
        return "kda" if (i + 1) in self.kda_layers else "mla"

    def ffn_kind(self, i: int) -> str:
        """"dense" or "moe" for zero-based layer i (the released KimiDecoderLayer rule)."""
        if self.num_experts is None or i < self.first_k_dense_replace or i % self.moe_layer_freq != 0:
            return "dense"
        return "moe"

    @property
    def kda_dim(self) -> int:
        """H * K (= H * V): width of the KDA q/k/v projections."""
        return self.kda_num_heads * self.kda_head_dim

    @property
    def mla_q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def shared_width(self) -> int:
        return self.moe_intermediate_size * self.num_shared_experts


def _swiglu_specs(p: str, gate: str, up: str, down: str, D: int, F: int) -> list:
    return [(p + gate + ".weight", [F, D], "matrix"), (p + up + ".weight", [F, D], "matrix"),
            (p + down + ".weight", [D, F], "matrix")]


def tensor_specs(cfg: KimiConfig) -> list:
    """Every checkpoint tensor once: (name, shape, kind); kind is "embed", "matrix" (a Linear, [out, in]),
    "norm_weight", "conv" ([C, 1, W]), "A_log" ([1, 1, H, 1]), "dt_bias" ([H*K]) or "router_bias"."""
    D = cfg.hidden_size
    specs = [("model.embed_tokens.weight", [cfg.vocab_size, D], "embed")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        specs.append((p + "input_layernorm.weight", [D], "norm_weight"))
        if cfg.layer_kind(i) == "kda":
            H, K, P = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_dim
            specs += [(a + f"{c}_proj.weight", [P, D], "matrix") for c in "qkv"]
            specs += [(a + f"{c}_conv1d.weight", [P, 1, cfg.conv_size], "conv") for c in "qkv"]
            specs += [(a + "A_log", [1, 1, H, 1], "A_log"), (a + "f_a_proj.weight", [K, D], "matrix"),
                      (a + "f_b_proj.weight", [P, K], "matrix"), (a + "dt_bias", [P], "dt_bias"),
                      (a + "b_proj.weight", [H, D], "matrix"), (a + "g_a_proj.weight", [K, D], "matrix"),
                      (a + "g_b_proj.weight", [P, K], "matrix"), (a + "o_norm.weight", [K], "norm_weight"),
                      (a + "o_proj.weight", [D, P], "matrix")]
        else:
            n, r, dr, dv = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim
            specs += [(a + "q_proj.weight", [n * cfg.mla_q_head_dim, D], "matrix"),
                      (a + "kv_a_proj_with_mqa.weight", [r + dr, D], "matrix"),
                      (a + "kv_a_layernorm.weight", [r], "norm_weight"),
                      (a + "kv_b_proj.weight", [n * (cfg.qk_nope_head_dim + dv), r], "matrix"),
                      (a + "o_proj.weight", [D, n * dv], "matrix")]
        specs.append((p + "post_attention_layernorm.weight", [D], "norm_weight"))
        if cfg.ffn_kind(i) == "dense":
            specs += _swiglu_specs(p + "mlp.", "gate_proj", "up_proj", "down_proj", D, cfg.intermediate_size)
        else:
            m, E, I = p + "block_sparse_moe.", cfg.num_experts, cfg.moe_intermediate_size
            specs += [(m + "gate.weight", [E, D], "matrix"), (m + "gate.e_score_correction_bias", [E], "router_bias")]
            for e in range(E):
                specs += _swiglu_specs(f"{m}experts.{e}.", "w1", "w3", "w2", D, I)
            if cfg.num_shared_experts:
                specs += _swiglu_specs(m + "shared_experts.", "gate_proj", "up_proj", "down_proj", D,
                                       cfg.shared_width)
    specs.append(("model.norm.weight", [D], "norm_weight"))
    if not cfg.tie_word_embeddings:
        specs.append(("lm_head.weight", [cfg.vocab_size, D], "matrix"))
    return specs


def canonical_weights(cfg: KimiConfig, tensors: dict, dtype: torch.dtype) -> dict:
    """Checkpoint tensors -> {name: tensor in dtype}. Raises on missing, unexpected or misshapen tensors."""
    expected = {name: shape for name, shape, _ in tensor_specs(cfg)}
    if set(tensors) != set(expected):
        raise ValueError(f"kimi_linear: missing {sorted(set(expected) - set(tensors))}, "
                         f"unexpected {sorted(set(tensors) - set(expected))}")
    for name, shape in expected.items():
        if list(tensors[name].shape) != shape:
            raise ValueError(f"kimi_linear: '{name}' has shape {list(tensors[name].shape)}, expected {shape}")
    return {name: t.to(dtype) for name, t in tensors.items()}


def initial_cache(cfg: KimiConfig, dtype: torch.dtype) -> list:
    """Per layer the state a sequence starts from, all empty/zero: KDA {"conv": {q, k, v: [W-1, H*K] raw
    projections}, "S": [H, K, V]}; MLA {"latent": [0, r] (c^ of every past token), "k_rope": [0, d_r]
    (k_r, rotated at its own position when RoPE is on)}."""
    cache = []
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_kind(i) == "kda":
            H, K, W = cfg.kda_num_heads, cfg.kda_head_dim, cfg.conv_size
            cache.append({"conv": {c: torch.zeros(W - 1, cfg.kda_dim, dtype=dtype) for c in "qkv"},
                          "S": torch.zeros(H, K, K, dtype=dtype)})
        else:
            cache.append({"latent": torch.zeros(0, cfg.kv_lora_rank, dtype=dtype),
                          "k_rope": torch.zeros(0, cfg.qk_rope_head_dim, dtype=dtype)})
    return cache


# ---------------------------------------------------------------------------------------------------
# KDA (spec 5B): delta_family.py's building blocks under Kimi's tensor names

def softplus_log_decay(cfg: KimiConfig, w: Weights, p: str, f: torch.Tensor) -> torch.Tensor:
    """Kimi-Linear's gate on f [T, H, K] (= f_b_proj(f_a_proj x)): a = -exp(A_log[h]) softplus(f + dt_bias)."""
    H, K = cfg.kda_num_heads, cfg.kda_head_dim
    return -torch.exp(w[p + "A_log"].reshape(H))[:, None] * softplus(f + w[p + "dt_bias"].reshape(H, K))


def low_rank_output_gate(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    """Kimi-Linear's KDA output gate logits g_b_proj(g_a_proj x), [T, H*K]."""
    return w.linear(w.linear(x, p + "g_a_proj.weight"), p + "g_b_proj.weight")


def kda_mixer(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor, state: dict, rec,
              log_decay_fn=softplus_log_decay, output_gate_fn=low_rank_output_gate) -> torch.Tensor:
    """KimiDeltaAttention, x [T, D] (after input_layernorm) -> [T, D] (before the residual add).
    log_decay_fn(cfg, w, p, f) gives a_t [T, H, K] from f [T, H, K]; output_gate_fn(cfg, w, p, x) the
    gate logits [T, H*K] (Kimi K3 replaces both)."""
    T, H, K = x.shape[0], cfg.kda_num_heads, cfg.kda_head_dim
    qkv = {}
    for c in "qkv":
        raw = w.linear(x, f"{p}{c}_proj.weight")
        qkv[c], state["conv"][c] = short_conv(raw, w[f"{p}{c}_conv1d.weight"], state["conv"][c], activate=True)
    rec("attn.q", qkv["q"])
    rec("attn.k", qkv["k"])
    rec("attn.v", qkv["v"])
    q = l2_normalize(qkv["q"].reshape(T, H, K)) * K ** -0.5
    k = l2_normalize(qkv["k"].reshape(T, H, K))
    v = qkv["v"].reshape(T, H, K)
    beta = rec("attn.beta", torch.sigmoid(w.linear(x, p + "b_proj.weight")))
    f = w.linear(w.linear(x, p + "f_a_proj.weight"), p + "f_b_proj.weight").reshape(T, H, K)
    log_decay = rec("attn.log_decay", log_decay_fn(cfg, w, p, f).reshape(T, H * K)).reshape(T, H, K)
    o, state["S"] = gated_delta_recurrent(q, k, v, beta, log_decay, state["S"])
    rec("attn.core", o.reshape(T, H * K))
    rec("attn.state", state["S"])
    gate = output_gate_fn(cfg, w, p, x).reshape(T, H, K)
    y = rms_norm(o, w[p + "o_norm.weight"], cfg.rms_norm_eps) * torch.sigmoid(gate)
    return w.linear(y.reshape(T, H * K), p + "o_proj.weight")


# ---------------------------------------------------------------------------------------------------
# MLA (spec 2.3, 2.4)

def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """DeepSeek-V3 interleaved RoPE on the last axis (even length d): x [T, ..., d], positions [T].
    Pair i = (x_2i, x_2i+1) rotates by positions * theta^(-2i/d); the output keeps the interleaved layout.
    Angles are formed in float64 and their cos/sin cast to x's dtype."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)             # [d/2]
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]                  # [T, d/2]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = angle.cos().to(x.dtype).reshape(shape), angle.sin().to(x.dtype).reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def _causal_softmax(scores: torch.Tensor, start: int) -> torch.Tensor:
    """scores [n, T, P] of queries at absolute positions start..start+T-1 over keys 0..P-1 ->
    probabilities, key j visible to query t iff j <= start + t."""
    T, P = scores.shape[1], scores.shape[2]
    visible = torch.arange(P)[None, :] <= (start + torch.arange(T))[:, None]
    return scores.masked_fill(~visible, -math.inf).softmax(dim=-1)


def _mla_explicit(cfg: KimiConfig, w: Weights, p: str, q: torch.Tensor, latent: torch.Tensor,
                  k_rope: torch.Tensor, start: int) -> torch.Tensor:
    """Naive/MHA form: K and V expanded from every cached latent. q [T, n, d_n+d_r], latent [P, r],
    k_rope [P, d_r] -> context [T, n*d_v]."""
    n, dn, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    P = latent.shape[0]
    kv = w.linear(latent, p + "kv_b_proj.weight").reshape(P, n, dn + dv)
    keys = torch.cat([kv[..., :dn], k_rope[:, None, :].expand(P, n, cfg.qk_rope_head_dim)], dim=-1)
    scores = torch.einsum("thd,phd->htp", q, keys) * cfg.mla_q_head_dim ** -0.5
    probs = _causal_softmax(scores, start)
    return torch.einsum("htp,phd->thd", probs, kv[..., dn:]).reshape(q.shape[0], n * dv)


def _mla_absorbed(cfg: KimiConfig, w: Weights, p: str, q: torch.Tensor, latent: torch.Tensor,
                  k_rope: torch.Tensor, start: int) -> torch.Tensor:
    """Absorbed form (spec 2.4): q~_h = W_UK,h^T q_n,h, scores over the latents plus the shared rope slot,
    c-bar_h = sum_j p_h(j) c^(j), o_h = W_UV,h c-bar_h. Same arguments and result as _mla_explicit."""
    name = p + "kv_b_proj.weight"
    if name in w.bf16_inputs:
        raise ValueError("absorbed MLA: the bf16 dot-product emulation is defined for the explicit form only")
    n, dn, dv, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    wkvb = w[name].reshape(n, dn + dv, r)
    w_uk, w_uv = wkvb[:, :dn, :], wkvb[:, dn:, :]
    q_tilde = torch.einsum("thd,hdr->thr", q[..., :dn], w_uk)
    scores = (torch.einsum("thr,pr->htp", q_tilde, latent)
              + torch.einsum("thd,pd->htp", q[..., dn:], k_rope)) * cfg.mla_q_head_dim ** -0.5
    probs = _causal_softmax(scores, start)
    c_bar = torch.einsum("htp,pr->thr", probs, latent)
    return torch.einsum("thr,hvr->thv", c_bar, w_uv).reshape(q.shape[0], n * dv)


def mla_mixer(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor, state: dict, rec,
              form: str = "explicit", query_fn=None, output_gate_fn=None) -> torch.Tensor:
    """KimiMLAAttention, x [T, D] (after input_layernorm) -> [T, D]; state holds the latents and k_r of the
    tokens before x and gains x's. query_fn(cfg, w, p, x) gives q [T, n*(d_n+d_r)] (default q_proj x);
    output_gate_fn(cfg, w, p, x), if given, the gate logits [T, n*d_v]: the context is multiplied by their
    sigmoid before o_proj (Kimi K3's q-LoRA and gated MLA)."""
    T, n, dn, r = x.shape[0], cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
    q = (w.linear(x, p + "q_proj.weight") if query_fn is None else query_fn(cfg, w, p, x))
    q = q.reshape(T, n, cfg.mla_q_head_dim)
    ckr = w.linear(x, p + "kv_a_proj_with_mqa.weight")
    latent = rms_norm(ckr[:, :r], w[p + "kv_a_layernorm.weight"], cfg.kv_a_norm_eps)
    k_rope = ckr[:, r:]
    start = state["latent"].shape[0]
    if not cfg.mla_use_nope:
        positions = torch.arange(start, start + T)
        q = torch.cat([q[..., :dn], rope_interleaved(q[..., dn:], positions, cfg.rope_theta)], dim=-1)
        k_rope = rope_interleaved(k_rope, positions, cfg.rope_theta)
    rec("attn.q", q.reshape(T, -1))
    rec("attn.latent", latent)
    rec("attn.k_rope", k_rope)
    state["latent"] = torch.cat([state["latent"], latent])
    state["k_rope"] = torch.cat([state["k_rope"], k_rope])
    attend = {"explicit": _mla_explicit, "absorbed": _mla_absorbed}[form]
    context = rec("attn.context", attend(cfg, w, p, q, state["latent"], state["k_rope"], start))
    if output_gate_fn is not None:
        context = context * torch.sigmoid(output_gate_fn(cfg, w, p, x))
    return w.linear(context, p + "o_proj.weight")


# ---------------------------------------------------------------------------------------------------
# MoE (spec 3.2, 3.3)

def rank_descending(x: torch.Tensor) -> torch.Tensor:
    """Indices of x's last axis ordered by larger value first, then lower index (a stable ascending sort
    of -x; -0.0 == 0.0, so exact ties, the 0.0 group mask included, go to the lower index)."""
    return torch.sort(-x, dim=-1, stable=True).indices


@dataclass
class Routing:
    """route()'s result for T tokens: ids [T, k] (selection order), weights [T, k] (final), and how
    robust the selection is: expert_margin [T] (gap between the k-th and (k+1)-th masked biased score; when
    both are group-masked exact 0.0 ties, the smallest |s'| of the kept experts instead; inf if k = E),
    group_margin [T] (gap between the topk_group-th and next group score; inf without grouping),
    zero_mask_changes [T] bool (the 0.0 and the -inf group masks select different experts: the mask in
    use, cfg.group_mask, matters) and denominator [T] (sum of the k gathered weights before
    renormalization)."""
    ids: torch.Tensor
    weights: torch.Tensor
    expert_margin: torch.Tensor
    group_margin: torch.Tensor
    zero_mask_changes: torch.Tensor
    denominator: torch.Tensor


def route(cfg: KimiConfig, logits: torch.Tensor, bias: torch.Tensor) -> Routing:
    """The router of spec 3.2 on logits [T, E] (= W_gate x) and e_score_correction_bias [E]."""
    T, E = logits.shape
    k, G = cfg.num_experts_per_token, cfg.num_expert_group
    s = torch.sigmoid(logits)
    biased = s + bias
    inf = torch.full((T,), math.inf, dtype=logits.dtype)
    if G > 1:
        group_scores = biased.reshape(T, G, E // G).topk(2, dim=-1).values.sum(dim=-1)   # [T, G]
        group_order = rank_descending(group_scores)
        kept_groups = torch.zeros(T, G, dtype=torch.bool).scatter(1, group_order[:, :cfg.topk_group], True)
        kept = kept_groups.repeat_interleave(E // G, dim=1)                               # [T, E]
        if cfg.topk_group < G:
            ranked = group_scores.gather(1, group_order)
            group_margin = ranked[:, cfg.topk_group - 1] - ranked[:, cfg.topk_group]
        else:
            group_margin = inf
    else:
        kept = torch.ones(T, E, dtype=torch.bool)
        group_margin = inf
    masked = torch.where(kept, biased, torch.full_like(biased, cfg.group_mask))
    order = rank_descending(masked)
    ids = order[:, :k]
    if k < E:
        ranked = masked.gather(1, order)
        gap = ranked[:, k - 1] - ranked[:, k]
        both_masked = ~kept.gather(1, order[:, k - 1:k + 1]).any(dim=1)
        nearest_zero = torch.where(kept, biased.abs(), torch.full_like(biased, math.inf)).min(dim=1).values
        expert_margin = torch.where(both_masked, nearest_zero, gap)
    else:
        expert_margin = inf
    other_mask = -math.inf if cfg.group_mask == 0.0 else 0.0
    ids_other = rank_descending(torch.where(kept, biased, torch.full_like(biased, other_mask)))[:, :k]
    zero_mask_changes = (ids.sort(dim=1).values != ids_other.sort(dim=1).values).any(dim=1)
    weights = (biased if cfg.router_bias_in_weights else s).gather(1, ids)
    denominator = weights.sum(dim=-1)
    if k > 1 and cfg.moe_renormalize:
        weights = weights / (denominator[:, None] + RENORM_EPS)
    weights = weights * cfg.routed_scaling_factor
    return Routing(ids, weights, expert_margin, group_margin, zero_mask_changes, denominator)


def glu(cfg: KimiConfig, w: Weights, x: torch.Tensor, gate: str, up: str, down: str) -> torch.Tensor:
    """down(act(gate(x), up(x))), weight names given in full: SwiGLU silu(g) * u, or K3's SiTU-GLU
    beta tanh(g / beta) sigmoid(g) * beta_lin tanh(u / beta_lin) (spec 5: the sigmoid of the uncapped g;
    beta_lin None leaves u uncapped)."""
    g, u = w.linear(x, gate), w.linear(x, up)
    if cfg.hidden_act == "situ":
        b, bl = cfg.situ_beta, cfg.situ_linear_beta
        capped_up = u if bl is None else bl * torch.tanh(u / bl)
        return w.linear(b * torch.tanh(g / b) * torch.sigmoid(g) * capped_up, down)
    return w.linear(silu(g) * u, down)


def router(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor, rec) -> Routing:
    """The MoE block's router on x [T, D]: records moe.router_logits, moe.expert_ids, moe.expert_weights."""
    logits = rec("moe.router_logits", w.linear(x, p + "gate.weight"))
    sel = route(cfg, logits, w[p + "gate.e_score_correction_bias"])
    rec("moe.expert_ids", sel.ids.to(x.dtype))
    rec("moe.expert_weights", sel.weights)
    return sel


def routed_experts(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor, sel: Routing) -> torch.Tensor:
    """sum_j w_j expert_{idx_j}(x) (j in selection order) on x [T, C]; the experts p + "experts.{e}." map
    C to C (Kimi-Linear: the hidden width; K3: the latent)."""
    T = x.shape[0]
    rows = torch.arange(T)
    expert_out = {}
    for e in sorted(set(sel.ids.flatten().tolist())):
        ep = f"{p}experts.{e}."
        expert_out[e] = glu(cfg, w, x, ep + "w1.weight", ep + "w3.weight", ep + "w2.weight")
    stacked = torch.stack([expert_out.get(e, torch.zeros_like(x)) for e in range(cfg.num_experts)])  # [E, T, D]
    out = torch.zeros_like(x)
    for j in range(cfg.num_experts_per_token):
        out = out + sel.weights[:, j, None] * stacked[sel.ids[:, j], rows]
    return out


def shared_experts(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    """The shared experts, one GLU of width moe_intermediate_size * num_shared_experts, unweighted."""
    sp = p + "shared_experts."
    return glu(cfg, w, x, sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight")


def moe_block(cfg: KimiConfig, w: Weights, p: str, x: torch.Tensor, rec) -> tuple:
    """KimiSparseMoeBlock, x [T, D] (after post_attention_layernorm) -> (output [T, D], Routing).
    Output = sum_j w_j expert_{idx_j}(x) (j in selection order) + shared(x)."""
    sel = router(cfg, w, p, x, rec)
    out = routed_experts(cfg, w, p, x, sel)
    if cfg.num_shared_experts:
        out = out + rec("moe.shared", shared_experts(cfg, w, p, x))
    return rec("moe.out", out), sel


# ---------------------------------------------------------------------------------------------------
# The model

def kimi_forward(cfg: KimiConfig, w: dict, tokens: torch.Tensor, record: Optional[dict] = None,
                 cache: Optional[list] = None, bf16_inputs: frozenset = frozenset(), mla_form: str = "explicit",
                 routing: Optional[list] = None) -> torch.Tensor:
    """tokens [T] int -> logits [T, vocab], in the dtype of w (from canonical_weights). cache (from
    initial_cache, or left by an earlier call) is the state the tokens continue from and is updated to the
    state after them; None starts from zeros. record: a dict that receives every named intermediate in
    forward order. bf16_inputs: weight names whose Linear rounds its input to bf16. mla_form "explicit" or
    "absorbed". routing: a list that receives (layer index, Routing) per MoE layer."""
    rec = recorder(record)

    w = Weights(w, bf16_inputs)
    dtype = w["model.embed_tokens.weight"].dtype
    if cache is None:
        cache = initial_cache(cfg, dtype)
    eps = cfg.rms_norm_eps
    x = rec("embed", w["model.embed_tokens.weight"][tokens])
    for i in range(cfg.num_hidden_layers):
        p, n = f"model.layers.{i}.", f"h{i}."
        lrec = (lambda prefix: lambda name, t: rec(prefix + name, t))(n)
        a = lrec("input_layernorm", rms_norm(x, w[p + "input_layernorm.weight"], eps))
        if cfg.layer_kind(i) == "kda":
            o = kda_mixer(cfg, w, p + "self_attn.", a, cache[i], lrec)
        else:
            o = mla_mixer(cfg, w, p + "self_attn.", a, cache[i], lrec, mla_form)
        o = lrec("attn.out", o)
        x = lrec("resid_mid", x + o)
        m = lrec("post_attention_layernorm", rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
        if cfg.ffn_kind(i) == "dense":
            mp = p + "mlp."
            f = lrec("mlp.out", glu(cfg, w, m, mp + "gate_proj.weight", mp + "up_proj.weight", mp + "down_proj.weight"))
        else:
            f, sel = moe_block(cfg, w, p + "block_sparse_moe.", m, lrec)
            if routing is not None:
                routing.append((i, sel))
        x = lrec("out", x + f)
    y = rec("norm", rms_norm(x, w["model.norm.weight"], eps))
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    return rec("logits", w.linear(y, head))


def mixer_shapes(cfg: KimiConfig, i: int, T: int) -> list:
    """What layer i's mixer records (KDA or MLA), in order, with shapes."""
    n = f"h{i}."
    if cfg.layer_kind(i) == "kda":
        H, K, P = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_dim
        return [(n + "attn.q", [T, P]), (n + "attn.k", [T, P]), (n + "attn.v", [T, P]), (n + "attn.beta", [T, H]),
                (n + "attn.log_decay", [T, P]), (n + "attn.core", [T, P]), (n + "attn.state", [H, K, K])]
    nh = cfg.num_attention_heads
    return [(n + "attn.q", [T, nh * cfg.mla_q_head_dim]), (n + "attn.latent", [T, cfg.kv_lora_rank]),
            (n + "attn.k_rope", [T, cfg.qk_rope_head_dim]), (n + "attn.context", [T, nh * cfg.v_head_dim])]


def decoder_shapes(cfg, T: int, mixer_shapes, experts_per_token: int, shared_expert: bool) -> list:
    """The names a pre-norm decoder records (kimi_forward, qwen.qwen_forward), in forward order, with their
    shapes: embed; per layer input_layernorm, mixer_shapes(cfg, i, T), attn.out, resid_mid,
    post_attention_layernorm, then mlp.out (dense FFN) or moe.router_logits, moe.expert_ids and
    moe.expert_weights [T, experts_per_token], moe.shared (if shared_expert), moe.out; out; then norm, logits."""
    D = cfg.hidden_size
    out = [("embed", [T, D])]
    for i in range(cfg.num_hidden_layers):
        n = f"h{i}."
        out.append((n + "input_layernorm", [T, D]))
        out += mixer_shapes(cfg, i, T)
        out += [(n + "attn.out", [T, D]), (n + "resid_mid", [T, D]), (n + "post_attention_layernorm", [T, D])]
        if cfg.ffn_kind(i) == "dense":
            out.append((n + "mlp.out", [T, D]))
        else:
            k = experts_per_token
            out += [(n + "moe.router_logits", [T, cfg.num_experts]), (n + "moe.expert_ids", [T, k]),
                    (n + "moe.expert_weights", [T, k])]
            if shared_expert:
                out.append((n + "moe.shared", [T, D]))
            out.append((n + "moe.out", [T, D]))
        out.append((n + "out", [T, D]))
    return out + [("norm", [T, D]), ("logits", [T, cfg.vocab_size])]


def intermediate_shapes(cfg: KimiConfig, T: int) -> list:
    """The names kimi_forward records, in forward order, with their shapes: the golden-data contract."""
    return decoder_shapes(cfg, T, mixer_shapes, cfg.num_experts_per_token, bool(cfg.num_shared_experts))
