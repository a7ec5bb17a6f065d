"""Qwen3-Next (model_type "qwen3_next", Qwen3NextForCausalLM) and Qwen3.5 (model_type "qwen3_5" /
"qwen3_5_moe", Qwen3_5(Moe)ForConditionalGeneration, text model only) forward in plain PyTorch, written from
/work/shared/spec/qwen3-next-and-qwen3.5.md. The golden reference for the C++ Qwen paths: it runs in the
dtype of the weights it is given (float64 for goldens) and records every named intermediate
(intermediate_shapes is the contract).

Block (every layer i, zero-based; spec 3.2):
    h += mixer_i(RMSNorm1p(h, input_layernorm)); h += ffn_i(RMSNorm1p(h, post_attention_layernorm))
    logits = lm_head RMSNorm1p(h, model.norm)   (tied: model embed_tokens as the head)
RMSNorm1p(x, w) = x rsqrt(mean(x^2) + eps) (1 + w), eps = rms_norm_eps (spec 3.1): input_layernorm,
post_attention_layernorm, model.norm, q_norm, k_norm. The GDN output norm is the gated RMSNorm with the
weight as is (no +1). No embedding scale, no soft-capping, no biases anywhere.

* Mixer: layer_types[i] "linear_attention" = Gated DeltaNet, "full_attention" = gated softmax attention;
  layer_types from config.json, else (i+1) % full_attention_interval == 0 -> full (spec 1.2).
  - GDN (spec 3.4; Hk key heads of dk, Hv value heads of dv, r = Hv / Hk, value head j reads key head
    j // r). Projections: qwen3_next P = in_proj_qkvz x, Q = in_proj_ba x, per key-head group g (base
    g (2dk + 2r dv)): q_g, k_g, then the group's r value heads, then their r z heads; b_{gr+i} = Q[2rg + i],
    a_{gr+i} = Q[2rg + r + i]. qwen3_5*: in_proj_qkv x = [q_all; k_all; v_all], in_proj_z, in_proj_b,
    in_proj_a (flat). u = [q_all; k_all; v_all] (C = 2 Hk dk + Hv dv channels, conv1d.weight's order),
    causal depthwise conv (kernel linear_conv_kernel_dim, no bias, zero history) + SiLU; q, k l2-normalized
    per head (x / sqrt(sum x^2 + 1e-6)), q times dk^-0.5; beta = sigmoid(b); g = -exp(A_log) softplus(a +
    dt_bias) (threshold 20); per token S <- exp(g) S, e = v - S^T k, S += k (beta e)^T, o = S^T q
    (S [Hv, dk, dv], zero at sequence start); y_j = RMSNorm(o_j) * norm.weight * silu(z_j) per value head
    (norm.weight [dv] shared); out_proj.
  - Gated attention (spec 3.3): q_proj x viewed [nh, 2 hd], head h = [query_h; gate_h]; k, v [nkv, hd];
    q_norm / k_norm per head (RMSNorm1p over hd); rotate-half RoPE on the first R = int(hd
    partial_rotary_factor) dims (pairs d, d + R/2, angle pos theta^(-2i/R), angles in float64, absolute
    positions counting cached tokens), the rest passes; causal softmax at scale hd^-0.5, q head h reads kv
    head h // (nh / nkv); context * sigmoid(gate) -> o_proj. Qwen3.5's interleaved M-RoPE is this same
    rotation for text-only input (spec 3.7): mrope_section is checked and otherwise unused.
* FFN: MoE where (qwen3_next) i not in mlp_only_layers and num_experts > 0 and (i+1) % decoder_sparse_step
  == 0, (qwen3_5_moe) always, (qwen3_5) never; else SwiGLU mlp.{gate,up,down}_proj of intermediate_size.
  MoE (spec 3.5): logits = mlp.gate x; p = softmax over all experts; the top-k (larger p first, ties to
  the lower index); weights p[idx], divided by their sum when norm_topk_prob (qwen3_5_moe: always);
  sum_j w_j Down_e(silu(Gate_e x) * Up_e x) + sigmoid(shared_expert_gate x) * shared_expert(x).
  Experts: qwen3_next mlp.experts.{e}.{gate,up,down}_proj.weight; qwen3_5_moe fused
  mlp.experts.gate_up_proj [E, 2I, H] (rows :I gate, I: up) and mlp.experts.down_proj [E, H, I].

Layouts (spec 2): qwen3_next tensors model.* + lm_head.weight, config.json flat; qwen3_5* config.json with
the text fields under text_config (model_type qwen3_5_text / qwen3_5_moe_text), text tensors
model.language_model.* + lm_head.weight (top level). mtp.* (both) and model.visual.* (qwen3_5*) are
skipped. canonical_weights renames the text tensors to model.* (the qwen3_next names). RoPE parameters are
read from rope_parameters {rope_type, rope_theta, partial_rotary_factor} or top-level rope_theta /
partial_rotary_factor / rope_scaling (both accepted; partial_rotary_factor defaults to 0.25).

bf16_inputs (bf16_weight_names of the checkpoint, canonical names) rounds the input of every Linear on a
BF16 weight to bf16 (the engine's bf16 dot products): in_proj_qkvz / in_proj_ba or in_proj_qkv / _z / _b
/ _a, out_proj, q/k/v/o_proj, the router gate, shared_expert_gate, every expert (per-expert or fused) and
shared-expert projection, the dense MLP, the head (lm_head or tied embed_tokens). Not linears: the
embedding lookup, conv1d, A_log, dt_bias, norm weights.

traps (a set of names, for the goldens' self-checks only; empty for the golden): misreadings of the spec
whose effect the goldens must show -- "plain_norm" (w instead of 1 + w), "gated_norm_plus_one",
"contiguous_qkvz" (qwen3_next's in_proj_qkvz / in_proj_ba split as four / two contiguous blocks),
"tiled_gva" (value head j reads key head j % Hk), "gate_blocks" (q_proj as [all queries; all gates]),
"full_rotary" (RoPE over all hd dims), "interleaved_rope" (pairs (2i, 2i+1)), "no_renorm"."""

import math
from dataclasses import dataclass
from typing import Optional

import torch

from delta_family import Weights, l2_normalize, round_bf16, short_conv, silu, softplus
from golden_io import recorder
from kimi_linear import decoder_shapes, rank_descending

FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
ARCHITECTURES = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration",
                 "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
TEXT_MODEL_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
TENSOR_PREFIX = {"qwen3_next": "model.", "qwen3_5": "model.language_model.", "qwen3_5_moe": "model.language_model."}
SKIPPED_PREFIXES = {"qwen3_next": ("mtp.",), "qwen3_5": ("mtp.", "model.visual."),
                    "qwen3_5_moe": ("mtp.", "model.visual.")}
LINEAR, FULL = "linear_attention", "full_attention"
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25   # spec 1.1: absent partial_rotary_factor
DEFAULT_FULL_ATTENTION_INTERVAL = 4    # TF Qwen3NextConfig kwarg default
TRAPS = ("plain_norm", "gated_norm_plus_one", "contiguous_qkvz", "tiled_gva", "gate_blocks", "full_rotary",
         "interleaved_rope", "no_renorm")

# Text-config fields every family must carry (absent ones raise); then each family's own.
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "rms_norm_eps", "linear_conv_kernel_dim", "linear_key_head_dim",
             "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads")
_MOE_REQUIRED = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
_FAMILY_REQUIRED = {"qwen3_next": ("intermediate_size", "norm_topk_prob") + _MOE_REQUIRED,
                    "qwen3_5": ("intermediate_size",), "qwen3_5_moe": _MOE_REQUIRED}


@dataclass(frozen=True)
class QwenConfig:
    """The config.json fields the forward depends on (HF names; the linear_* ones shortened). Build it
    with from_json."""

    family: str                      # qwen3_next, qwen3_5 or qwen3_5_moe (the top-level model_type)
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    layer_types: tuple
    conv_kernel: int                 # linear_conv_kernel_dim
    key_head_dim: int                # dk
    value_head_dim: int              # dv
    num_key_heads: int               # Hk
    num_value_heads: int             # Hv
    intermediate_size: Optional[int]
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    mlp_only_layers: tuple = ()
    decoder_sparse_step: int = 1

    @classmethod
    def from_json(cls, d: dict) -> "QwenConfig":
        """config.json (dict) -> QwenConfig. Raises ValueError on a missing field or an option this
        reference does not implement."""
        family = d.get("model_type")
        if family not in FAMILIES:
            raise ValueError(f"config.json: model_type {family!r}, expected one of {FAMILIES}")

        def bad(field, found, expected):
            raise ValueError(f"config.json ({family}): '{field}' is {found!r}, expected {expected}")
        if family == "qwen3_next":
            t = d
        else:
            t = d.get("text_config")
            if not isinstance(t, dict):
                bad("text_config", t, "an object with the text model's fields")
            if t.get("model_type") != TEXT_MODEL_TYPES[family]:
                bad("text_config.model_type", t.get("model_type"), repr(TEXT_MODEL_TYPES[family]))
        missing = [k for k in _REQUIRED + _FAMILY_REQUIRED[family] if k not in t]
        if missing:
            raise ValueError(f"config.json ({family}): missing text fields {missing}")
        if t.get("hidden_act", "silu") != "silu":
            bad("hidden_act", t["hidden_act"], "'silu'")
        if t.get("attention_bias", False):
            bad("attention_bias", t["attention_bias"], "false (no biases in these models)")
        if not t.get("attn_output_gate", True):
            bad("attn_output_gate", False, "true (the gated attention of spec 3.3)")
        theta, prf = _rope_params(family, t)

        L = t["num_hidden_layers"]
        if t.get("layer_types") is not None:
            layer_types = tuple(t["layer_types"])
        else:
            interval = t.get("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)
            layer_types = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(L))
        if len(layer_types) != L or set(layer_types) - {LINEAR, FULL}:
            bad("layer_types", list(layer_types), f"{L} entries of '{LINEAR}' / '{FULL}'")

        tie = t.get("tie_word_embeddings")
        if family != "qwen3_next" and "tie_word_embeddings" in d:
            if tie is not None and bool(tie) != bool(d["tie_word_embeddings"]):
                bad("tie_word_embeddings", d["tie_word_embeddings"], f"text_config's value {tie!r}")
            tie = d["tie_word_embeddings"]
        moe = family != "qwen3_5"
        cfg = cls(
            family=family, vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_hidden_layers=L,
            rms_norm_eps=float(t["rms_norm_eps"]), tie_word_embeddings=bool(tie),
            num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_key_value_heads"],
            head_dim=t["head_dim"], rope_theta=theta, partial_rotary_factor=prf, layer_types=layer_types,
            conv_kernel=t["linear_conv_kernel_dim"], key_head_dim=t["linear_key_head_dim"],
            value_head_dim=t["linear_value_head_dim"], num_key_heads=t["linear_num_key_heads"],
            num_value_heads=t["linear_num_value_heads"], intermediate_size=t.get("intermediate_size"),
            num_experts=t["num_experts"] if moe else 0,
            num_experts_per_tok=t["num_experts_per_tok"] if moe else 0,
            moe_intermediate_size=t["moe_intermediate_size"] if moe else 0,
            shared_expert_intermediate_size=t["shared_expert_intermediate_size"] if moe else 0,
            # qwen3_5_moe has no norm_topk_prob: its router always renormalizes (spec 1.3)
            norm_topk_prob=bool(t["norm_topk_prob"]) if family == "qwen3_next" else True,
            mlp_only_layers=tuple(t.get("mlp_only_layers") or ()) if family == "qwen3_next" else (),
            decoder_sparse_step=t.get("decoder_sparse_step", 1) if family == "qwen3_next" else 1)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def bad(field, found, expected):
            raise ValueError(f"config.json ({self.family}): '{field}' is {found!r}, expected {expected}")
        if self.num_attention_heads % self.num_key_value_heads:
            bad("num_key_value_heads", self.num_key_value_heads, f"a divisor of {self.num_attention_heads}")
        if self.num_value_heads % self.num_key_heads:
            bad("linear_num_value_heads", self.num_value_heads, f"a multiple of {self.num_key_heads}")
        R = self.rotary_dim
        if R % 2 or not 0 < R <= self.head_dim:
            bad("partial_rotary_factor", self.partial_rotary_factor, f"an even rotary width in 2..{self.head_dim}")
        if self.num_experts:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                bad("num_experts_per_tok", self.num_experts_per_tok, f"1..{self.num_experts}")
            if self.shared_expert_intermediate_size <= 0:
                bad("shared_expert_intermediate_size", self.shared_expert_intermediate_size,
                    "> 0 (the shared expert is always built)")
        if any(self.ffn_kind(i) == "dense" for i in range(self.num_hidden_layers)) and not self.intermediate_size:
            bad("intermediate_size", self.intermediate_size, "> 0 (a layer has a dense MLP)")
        if self.decoder_sparse_step < 1:
            bad("decoder_sparse_step", self.decoder_sparse_step, ">= 1")

    @property
    def prefix(self) -> str:
        """Where the text tensors live in the checkpoint (canonical_weights renames them to model.*)."""
        return TENSOR_PREFIX[self.family]

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gva_ratio(self) -> int:
        return self.num_value_heads // self.num_key_heads

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def fused_experts(self) -> bool:
        return self.family == "qwen3_5_moe"

    def layer_kind(self, i: int) -> str:
        return "gdn" if self.layer_types[i] == LINEAR else "attention"

    def ffn_kind(self, i: int) -> str:
        if self.family == "qwen3_5":
            return "dense"
        if self.family == "qwen3_5_moe":
            return "moe"
        sparse = (i not in self.mlp_only_layers and self.num_experts > 0
                  and (i + 1) % self.decoder_sparse_step == 0)
        return "moe" if sparse else "dense"


def _rope_params(family: str, t: dict) -> tuple:
    """(rope_theta, partial_rotary_factor) from rope_parameters or the top-level fields (both accepted; they
    must agree where both are given). rope_type must be default and rope_scaling null."""
    def bad(field, found, expected):
        raise ValueError(f"config.json ({family}): '{field}' is {found!r}, expected {expected}")
    rp = t.get("rope_parameters") or {}
    if rp.get("rope_type", "default") != "default":
        bad("rope_parameters.rope_type", rp.get("rope_type"), "'default'")
    scaling = t.get("rope_scaling")
    if scaling is not None and (scaling.get("rope_type", scaling.get("type")) != "default"):
        bad("rope_scaling", scaling, "null")
    values = {}
    for name, default in (("rope_theta", None), ("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY_FACTOR)):
        nested, top = rp.get(name), t.get(name)
        if nested is not None and top is not None and float(nested) != float(top):
            bad(name, top, f"rope_parameters.{name} ({nested!r})")
        value = nested if nested is not None else top if top is not None else default
        if value is None:
            raise ValueError(f"config.json ({family}): missing rope_theta (top level or in rope_parameters)")
        values[name] = float(value)
    section = rp.get("mrope_section")
    head_dim = t.get("head_dim", 0)
    if section is not None and 2 * sum(section) != int(head_dim * values["partial_rotary_factor"]):
        bad("rope_parameters.mrope_section", section, "frequency counts summing to half the rotary width")
    return values["rope_theta"], values["partial_rotary_factor"]


# ---------------------------------------------------------------------------------------------------
# Tensors

def _swiglu_specs(p: str, D: int, F: int) -> list:
    return [(p + "gate_proj.weight", [F, D], "matrix"), (p + "up_proj.weight", [F, D], "matrix"),
            (p + "down_proj.weight", [D, F], "matrix")]


def tensor_specs(cfg: QwenConfig) -> list:
    """The text model's tensors in module order under canonical names (model.*, lm_head.weight): (name,
    shape, kind); kind is embed, matrix, norm1p (stored w of a 1 + w norm), gated_norm (plain weight),
    conv ([C, 1, K]), A_log, dt_bias, experts ([E, rows, cols] fused matrices)."""
    D, V = cfg.hidden_size, cfg.vocab_size
    Hv, dv = cfg.num_value_heads, cfg.value_head_dim
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    specs = [("model.embed_tokens.weight", [V, D], "embed")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", [D], "norm1p"))
        if cfg.layer_kind(i) == "gdn":
            a = p + "linear_attn."
            if cfg.family == "qwen3_next":
                specs += [(a + "in_proj_qkvz.weight", [2 * cfg.key_dim + 2 * cfg.value_dim, D], "matrix"),
                          (a + "in_proj_ba.weight", [2 * Hv, D], "matrix")]
            else:
                specs += [(a + "in_proj_qkv.weight", [cfg.conv_dim, D], "matrix"),
                          (a + "in_proj_z.weight", [cfg.value_dim, D], "matrix"),
                          (a + "in_proj_b.weight", [Hv, D], "matrix"), (a + "in_proj_a.weight", [Hv, D], "matrix")]
            specs += [(a + "conv1d.weight", [cfg.conv_dim, 1, cfg.conv_kernel], "conv"),
                      (a + "dt_bias", [Hv], "dt_bias"), (a + "A_log", [Hv], "A_log"),
                      (a + "norm.weight", [dv], "gated_norm"), (a + "out_proj.weight", [D, Hv * dv], "matrix")]
        else:
            a = p + "self_attn."
            specs += [(a + "q_proj.weight", [2 * nh * hd, D], "matrix"), (a + "k_proj.weight", [nkv * hd, D], "matrix"),
                      (a + "v_proj.weight", [nkv * hd, D], "matrix"), (a + "o_proj.weight", [D, nh * hd], "matrix"),
                      (a + "q_norm.weight", [hd], "norm1p"), (a + "k_norm.weight", [hd], "norm1p")]
        specs.append((p + "post_attention_layernorm.weight", [D], "norm1p"))
        m = p + "mlp."
        if cfg.ffn_kind(i) == "dense":
            specs += _swiglu_specs(m, D, cfg.intermediate_size)
            continue
        E, I = cfg.num_experts, cfg.moe_intermediate_size
        specs.append((m + "gate.weight", [E, D], "matrix"))
        if cfg.fused_experts:
            specs += [(m + "experts.gate_up_proj", [E, 2 * I, D], "experts"),
                      (m + "experts.down_proj", [E, D, I], "experts")]
        else:
            for e in range(E):
                specs += _swiglu_specs(f"{m}experts.{e}.", D, I)
        specs += _swiglu_specs(m + "shared_expert.", D, cfg.shared_expert_intermediate_size)
        specs.append((m + "shared_expert_gate.weight", [1, D], "matrix"))
    specs.append(("model.norm.weight", [D], "norm1p"))
    if not cfg.tie_word_embeddings:
        specs.append(("lm_head.weight", [V, D], "matrix"))
    return specs


def checkpoint_name(cfg: QwenConfig, name: str) -> str:
    """Canonical name -> the name in the family's checkpoint."""
    return name if not name.startswith("model.") else cfg.prefix + name[len("model."):]


def text_tensors(cfg: QwenConfig, tensors: dict) -> dict:
    """Checkpoint tensors -> the text model's under canonical names; mtp.* (and model.visual.* for
    qwen3_5*) skipped. Raises on missing, unexpected or misshapen tensors."""
    expected = {checkpoint_name(cfg, name): (name, shape) for name, shape, _ in tensor_specs(cfg)}
    skipped = SKIPPED_PREFIXES[cfg.family]
    present = {n for n in tensors if not n.startswith(skipped)}
    if present != set(expected):
        raise ValueError(f"{cfg.family}: missing {sorted(set(expected) - present)}, "
                         f"unexpected {sorted(present - set(expected))}")
    out = {}
    for stored, (name, shape) in expected.items():
        if list(tensors[stored].shape) != shape:
            raise ValueError(f"{cfg.family}: '{stored}' has shape {list(tensors[stored].shape)}, expected {shape}")
        out[name] = tensors[stored]
    return out


def canonical_weights(cfg: QwenConfig, tensors: dict, dtype: torch.dtype) -> dict:
    """Checkpoint tensors -> {canonical name: tensor in dtype} (text_tensors, widened exactly)."""
    return {name: t.to(dtype) for name, t in text_tensors(cfg, tensors).items()}


def bf16_weight_names(cfg: QwenConfig, tensors: dict) -> frozenset:
    """Canonical names of the text tensors stored in BF16: qwen_forward's bf16_inputs (only linears are
    looked up in it)."""
    return frozenset(name for name, t in text_tensors(cfg, tensors).items() if t.dtype == torch.bfloat16)


def initial_cache(cfg: QwenConfig, dtype: torch.dtype) -> list:
    """Per layer the state a sequence starts from: GDN {"conv": [K-1, C] the last raw (pre-conv) u rows,
    zeros; "S": [Hv, dk, dv] zeros}; attention {"k": [0, nkv, hd] (after k_norm and RoPE), "v": [0, nkv, hd]}."""
    cache = []
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_kind(i) == "gdn":
            cache.append({"conv": torch.zeros(cfg.conv_kernel - 1, cfg.conv_dim, dtype=dtype),
                          "S": torch.zeros(cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim, dtype=dtype)})
        else:
            shape = (0, cfg.num_key_value_heads, cfg.head_dim)
            cache.append({"k": torch.zeros(shape, dtype=dtype), "v": torch.zeros(shape, dtype=dtype)})
    return cache


# ---------------------------------------------------------------------------------------------------
# Building blocks

def rms_norm_1p(x: torch.Tensor, weight: torch.Tensor, eps: float, plus_one: bool = True) -> torch.Tensor:
    """Zero-centred RMSNorm over the last axis: x rsqrt(mean(x^2) + eps) (1 + weight) (spec 3.1);
    plus_one False: times weight (the "plain_norm" trap)."""
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y * (1.0 + weight if plus_one else weight)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3NextRMSNormGated over the last axis: x rsqrt(mean(x^2) + eps) weight silu(z), the weight as is."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight * silu(z)


def rope_rotate_half(x: torch.Tensor, positions: torch.Tensor, theta: float, R: int,
                     interleaved: bool = False) -> torch.Tensor:
    """Partial NeoX RoPE on x [T, heads, hd]: dims [0, R) rotate in pairs (i, i + R/2) by the angle
    positions[t] theta^(-2i/R) (i < R/2), x'_i = x_i cos - x_{i+R/2} sin, x'_{i+R/2} = x_{i+R/2} cos + x_i sin;
    dims [R, hd) pass through. Angles in float64, cos/sin cast to x's dtype. interleaved: pairs (2i, 2i+1)
    instead (the "interleaved_rope" trap)."""
    half = R // 2
    inv_freq = theta ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)             # [R/2]
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]                  # [T, R/2]
    cos, sin = angle.cos().to(x.dtype)[:, None, :], angle.sin().to(x.dtype)[:, None, :]
    rot, rest = x[..., :R], x[..., R:]
    if interleaved:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    else:
        x0, x1 = rot[..., :half], rot[..., half:]
        rot = torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return torch.cat((rot, rest), dim=-1)


def gdn_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                  S: torch.Tensor, key_head: torch.Tensor) -> tuple:
    """The gated delta rule of spec 3.4 step 6, one token at a time: q, k [T, Hk, dk] (normalized, q
    scaled), v [T, Hv, dv], beta, g [T, Hv], S [Hv, dk, dv], key_head [Hv] (value head j reads q/k head
    key_head[j]). Per token and value head: S <- exp(g) S; e = v - S^T k; S <- S + k (beta e)^T;
    o = S^T q. Returns o [T, Hv, dv] and the final S."""
    o = torch.empty(v.shape, dtype=v.dtype)
    for t in range(q.shape[0]):
        kt, qt = k[t, key_head], q[t, key_head]                                # [Hv, dk]
        S = S * torch.exp(g[t])[:, None, None]
        e = v[t] - torch.einsum("hk,hkv->hv", kt, S)
        S = S + kt[:, :, None] * (beta[t][:, None] * e)[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", qt, S)
    return o, S


def _gdn_projections(cfg: QwenConfig, w: Weights, p: str, x: torch.Tensor, traps: frozenset) -> tuple:
    """(u [T, C] = [q_all; k_all; v_all], z [T, Hv, dv], b [T, Hv], a [T, Hv]) from the family's
    projections (spec 3.4 step 1)."""
    T, Hk, Hv, dk, dv, r = x.shape[0], cfg.num_key_heads, cfg.num_value_heads, cfg.key_head_dim, \
        cfg.value_head_dim, cfg.gva_ratio
    if cfg.family != "qwen3_next":
        return (w.linear(x, p + "in_proj_qkv.weight"), w.linear(x, p + "in_proj_z.weight").reshape(T, Hv, dv),
                w.linear(x, p + "in_proj_b.weight"), w.linear(x, p + "in_proj_a.weight"))
    P = w.linear(x, p + "in_proj_qkvz.weight")
    Q = w.linear(x, p + "in_proj_ba.weight")
    if "contiguous_qkvz" in traps:
        KD, VD = cfg.key_dim, cfg.value_dim
        return P[:, :2 * KD + VD], P[:, 2 * KD + VD:].reshape(T, Hv, dv), Q[:, :Hv], Q[:, Hv:]
    P = P.reshape(T, Hk, 2 * dk + 2 * r * dv)   # per key-head group g: q_g, k_g, v_{gr..gr+r-1}, z_{gr..}
    q, k = P[..., :dk].reshape(T, Hk * dk), P[..., dk:2 * dk].reshape(T, Hk * dk)
    v = P[..., 2 * dk:2 * dk + r * dv].reshape(T, Hv * dv)
    z = P[..., 2 * dk + r * dv:].reshape(T, Hv, dv)
    Q = Q.reshape(T, Hk, 2 * r)                 # per group: b_{gr..gr+r-1}, a_{gr..gr+r-1}
    return torch.cat([q, k, v], dim=-1), z, Q[..., :r].reshape(T, Hv), Q[..., r:].reshape(T, Hv)


def gdn_mixer(cfg: QwenConfig, w: Weights, p: str, x: torch.Tensor, state: dict, rec,
              traps: frozenset = frozenset()) -> torch.Tensor:
    """Gated DeltaNet (spec 3.4), x [T, D] (after input_layernorm) -> [T, D]; state {"conv", "S"} is
    continued and updated."""
    T, Hk, Hv, dk, dv = x.shape[0], cfg.num_key_heads, cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim
    KD = cfg.key_dim
    u, z, b, a = _gdn_projections(cfg, w, p, x, traps)
    y, state["conv"] = short_conv(u, w[p + "conv1d.weight"], state["conv"], activate=True)
    q, k, v = rec("attn.q", y[:, :KD]), rec("attn.k", y[:, KD:2 * KD]), rec("attn.v", y[:, 2 * KD:])
    beta = rec("attn.beta", torch.sigmoid(b))
    g = rec("attn.log_decay", -torch.exp(w[p + "A_log"]) * softplus(a + w[p + "dt_bias"]))
    q = l2_normalize(q.reshape(T, Hk, dk)) * dk ** -0.5
    k = l2_normalize(k.reshape(T, Hk, dk))
    heads = torch.arange(Hv)
    key_head = heads % Hk if "tiled_gva" in traps else heads // cfg.gva_ratio
    o, state["S"] = gdn_recurrent(q, k, v.reshape(T, Hv, dv), beta, g, state["S"], key_head)
    rec("attn.core", o.reshape(T, Hv * dv))
    rec("attn.state", state["S"])
    weight = w[p + "norm.weight"] + (1.0 if "gated_norm_plus_one" in traps else 0.0)
    y = gated_rms_norm(o, z, weight, cfg.rms_norm_eps)
    return w.linear(y.reshape(T, Hv * dv), p + "out_proj.weight")


def _causal_softmax(scores: torch.Tensor, start: int) -> torch.Tensor:
    """scores [n, T, P] of queries at positions start..start+T-1 over keys 0..P-1; key j visible iff
    j <= start + t."""
    T, P = scores.shape[1], scores.shape[2]
    visible = torch.arange(P)[None, :] <= (start + torch.arange(T))[:, None]
    return scores.masked_fill(~visible, -math.inf).softmax(dim=-1)


def attention_mixer(cfg: QwenConfig, w: Weights, p: str, x: torch.Tensor, state: dict, rec,
                    traps: frozenset = frozenset()) -> torch.Tensor:
    """Gated softmax attention (spec 3.3), x [T, D] (after input_layernorm) -> [T, D]; state {"k", "v"}
    holds the earlier tokens' keys (after k_norm and RoPE) and values and gains x's."""
    T, nh, nkv, hd = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps, plus_one = cfg.rms_norm_eps, "plain_norm" not in traps
    qg = w.linear(x, p + "q_proj.weight")
    if "gate_blocks" in traps:
        q, gate = qg.reshape(T, 2, nh, hd).unbind(dim=1)
    else:
        qg = qg.reshape(T, nh, 2 * hd)            # head h: rows h*2hd .. +hd query, +hd .. +2hd gate
        q, gate = qg[..., :hd], qg[..., hd:]
    k = w.linear(x, p + "k_proj.weight").reshape(T, nkv, hd)
    v = w.linear(x, p + "v_proj.weight").reshape(T, nkv, hd)
    q = rms_norm_1p(q, w[p + "q_norm.weight"], eps, plus_one)
    k = rms_norm_1p(k, w[p + "k_norm.weight"], eps, plus_one)
    start = state["k"].shape[0]
    positions = torch.arange(start, start + T)
    R = hd if "full_rotary" in traps else cfg.rotary_dim
    interleaved = "interleaved_rope" in traps
    q = rope_rotate_half(q, positions, cfg.rope_theta, R, interleaved)
    k = rope_rotate_half(k, positions, cfg.rope_theta, R, interleaved)
    rec("attn.q", q.reshape(T, nh * hd))
    rec("attn.k", k.reshape(T, nkv * hd))
    rec("attn.v", v.reshape(T, nkv * hd))
    rec("attn.gate", gate.reshape(T, nh * hd))
    state["k"], state["v"] = torch.cat([state["k"], k]), torch.cat([state["v"], v])
    kv_head = torch.arange(nh) // (nh // nkv)
    keys, values = state["k"][:, kv_head], state["v"][:, kv_head]             # [P, nh, hd]
    probs = _causal_softmax(torch.einsum("thd,phd->htp", q, keys) * hd ** -0.5, start)
    context = rec("attn.context", torch.einsum("htp,phd->thd", probs, values).reshape(T, nh * hd))
    return w.linear(context * torch.sigmoid(gate.reshape(T, nh * hd)), p + "o_proj.weight")


# ---------------------------------------------------------------------------------------------------
# FFNs

@dataclass
class Routing:
    """The router's choice for T tokens: ids [T, k] (larger probability first, ties to the lower index),
    weights [T, k] (final), margin [T] (p of the k-th minus p of the (k+1)-th expert; inf when k = E),
    denominator [T] (sum of the k probabilities before renormalization)."""
    ids: torch.Tensor
    weights: torch.Tensor
    margin: torch.Tensor
    denominator: torch.Tensor


def route(cfg: QwenConfig, logits: torch.Tensor, renormalize: bool) -> Routing:
    """Softmax over all experts, top-k, optional renormalization (spec 3.5)."""
    T, E = logits.shape
    k = cfg.num_experts_per_tok
    probs = logits.softmax(dim=-1)
    order = rank_descending(probs)
    ranked = probs.gather(1, order)
    ids = order[:, :k]
    margin = ranked[:, k - 1] - ranked[:, k] if k < E else torch.full((T,), math.inf, dtype=logits.dtype)
    weights = probs.gather(1, ids)
    denominator = weights.sum(dim=-1)
    if renormalize:
        weights = weights / denominator[:, None]
    return Routing(ids, weights, margin, denominator)


def expert_linear(w: Weights, x: torch.Tensor, name: str, e: int, rows: slice = slice(None)) -> torch.Tensor:
    """x @ W[e][rows]^T for a fused expert tensor W [E, out, in]; its input rounded to bf16 when the fused
    tensor is in w.bf16_inputs."""
    return (round_bf16(x) if name in w.bf16_inputs else x) @ w[name][e, rows].T


def swiglu(w: Weights, x: torch.Tensor, p: str) -> torch.Tensor:
    """p + down_proj(silu(p + gate_proj x) * p + up_proj x)."""
    h = silu(w.linear(x, p + "gate_proj.weight")) * w.linear(x, p + "up_proj.weight")
    return w.linear(h, p + "down_proj.weight")


def expert(cfg: QwenConfig, w: Weights, p: str, x: torch.Tensor, e: int) -> torch.Tensor:
    """Routed expert e of the MoE block p on x [T, D]: per-expert tensors (qwen3_next) or the fused
    gate_up_proj [E, 2I, D] (gate rows first) / down_proj [E, D, I] (qwen3_5_moe)."""
    if not cfg.fused_experts:
        return swiglu(w, x, f"{p}experts.{e}.")
    I, gu = cfg.moe_intermediate_size, p + "experts.gate_up_proj"
    h = silu(expert_linear(w, x, gu, e, slice(0, I))) * expert_linear(w, x, gu, e, slice(I, 2 * I))
    return expert_linear(w, h, p + "experts.down_proj", e)


def moe_block(cfg: QwenConfig, w: Weights, p: str, x: torch.Tensor, rec, traps: frozenset = frozenset()) -> tuple:
    """The sparse MoE block (spec 3.5), x [T, D] (after post_attention_layernorm) -> (out [T, D], Routing)."""
    T = x.shape[0]
    logits = rec("moe.router_logits", w.linear(x, p + "gate.weight"))
    sel = route(cfg, logits, cfg.norm_topk_prob and "no_renorm" not in traps)
    rec("moe.expert_ids", sel.ids.to(x.dtype))
    rec("moe.expert_weights", sel.weights)
    rows = torch.arange(T)
    outputs = {e: expert(cfg, w, p, x, e) for e in sorted(set(sel.ids.flatten().tolist()))}
    stacked = torch.stack([outputs.get(e, torch.zeros_like(x)) for e in range(cfg.num_experts)])  # [E, T, D]
    routed = torch.zeros_like(x)
    for j in range(cfg.num_experts_per_tok):
        routed = routed + sel.weights[:, j, None] * stacked[sel.ids[:, j], rows]
    shared_gate = torch.sigmoid(w.linear(x, p + "shared_expert_gate.weight"))          # [T, 1]
    shared = rec("moe.shared", shared_gate * swiglu(w, x, p + "shared_expert."))
    return rec("moe.out", routed + shared), sel


# ---------------------------------------------------------------------------------------------------
# The model

def qwen_forward(cfg: QwenConfig, w: dict, tokens: torch.Tensor, record: Optional[dict] = None,
                 cache: Optional[list] = None, bf16_inputs: frozenset = frozenset(),
                 routing: Optional[list] = None, traps: frozenset = frozenset()) -> torch.Tensor:
    """tokens [T] int -> logits [T, vocab], in the dtype of w (canonical_weights). cache (initial_cache, or
    left by an earlier call) is the state the tokens continue from and is updated to the state after them;
    None starts from zeros. record: a dict receiving every named intermediate in forward order.
    bf16_inputs: canonical weight names whose Linear rounds its input to bf16. routing: a list receiving
    (layer, Routing) per MoE layer. traps: misreadings to apply (self-checks only; see the module doc)."""
    unknown = set(traps) - set(TRAPS)
    if unknown:
        raise ValueError(f"qwen_forward: unknown traps {sorted(unknown)}")
    rec = recorder(record)
    w = Weights(w, bf16_inputs)
    embed = w["model.embed_tokens.weight"]
    if cache is None:
        cache = initial_cache(cfg, embed.dtype)
    eps, plus_one = cfg.rms_norm_eps, "plain_norm" not in traps
    h = rec("embed", embed[tokens])
    for i in range(cfg.num_hidden_layers):
        p, n = f"model.layers.{i}.", f"h{i}."
        lrec = (lambda prefix: lambda name, t: rec(prefix + name, t))(n)
        x = lrec("input_layernorm", rms_norm_1p(h, w[p + "input_layernorm.weight"], eps, plus_one))
        if cfg.layer_kind(i) == "gdn":
            o = gdn_mixer(cfg, w, p + "linear_attn.", x, cache[i], lrec, traps)
        else:
            o = attention_mixer(cfg, w, p + "self_attn.", x, cache[i], lrec, traps)
        o = lrec("attn.out", o)
        h = lrec("resid_mid", h + o)
        m = lrec("post_attention_layernorm", rms_norm_1p(h, w[p + "post_attention_layernorm.weight"], eps, plus_one))
        if cfg.ffn_kind(i) == "dense":
            f = lrec("mlp.out", swiglu(w, m, p + "mlp."))
        else:
            f, sel = moe_block(cfg, w, p + "mlp.", m, lrec, traps)
            if routing is not None:
                routing.append((i, sel))
        h = lrec("out", h + f)
    y = rec("norm", rms_norm_1p(h, w["model.norm.weight"], eps, plus_one))
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    return rec("logits", w.linear(y, head))


def mixer_shapes(cfg: QwenConfig, i: int, T: int) -> list:
    """What layer i's mixer records, in order, with shapes."""
    n = f"h{i}."
    if cfg.layer_kind(i) == "gdn":
        Hv, dk, dv = cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim
        return [(n + "attn.q", [T, cfg.key_dim]), (n + "attn.k", [T, cfg.key_dim]), (n + "attn.v", [T, cfg.value_dim]),
                (n + "attn.beta", [T, Hv]), (n + "attn.log_decay", [T, Hv]), (n + "attn.core", [T, Hv * dv]),
                (n + "attn.state", [Hv, dk, dv])]
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return [(n + "attn.q", [T, nh * hd]), (n + "attn.k", [T, nkv * hd]), (n + "attn.v", [T, nkv * hd]),
            (n + "attn.gate", [T, nh * hd]), (n + "attn.context", [T, nh * hd])]


def intermediate_shapes(cfg: QwenConfig, T: int) -> list:
    """The names qwen_forward records, in forward order, with their shapes: the golden-data contract (every
    MoE layer has its gated shared expert)."""
    return decoder_shapes(cfg, T, mixer_shapes, cfg.num_experts_per_tok, shared_expert=True)
