"""Kimi K3 (model_type "kimi_k3", KimiK3ForConditionalGeneration; its text model is KimiLinearForCausalLM
with K3's fields) forward in plain PyTorch, written from /work/shared/spec/attention-mla-moe-attnres.md
sections 2, 3.2, 4.2, 5, 6.3 and 8 and linear-attention-family.md sections 1.4 and 5. The golden reference
for the C++ Kimi K3 path: it runs in the dtype of the weights it is given (float64 for goldens) and records
every named intermediate (intermediate_shapes is the contract). Only the text model: the vision tower and
projector tensors are skipped.

What differs from Kimi Linear (kimi_linear.py, whose pieces this module reuses where the math is the same):

* Layouts. Published: config.json {model_type kimi_k3, architectures [KimiK3ForConditionalGeneration],
  text_config {model_type kimi_linear, ...}, vision_config}, text tensors under "language_model."
  ("language_model.model.layers.{i}...", "language_model.lm_head.weight"), vision tensors
  "vision_tower.*" / "mm_projector.*" (skipped). Text-only: config.json of model_type kimi_linear with
  K3's fields at top level, tensors "model.*" and "lm_head.weight".
* MLA with q-LoRA: q = q_b_proj RMSNorm_{q_a_layernorm, 1e-6}(q_a_proj x) (the released class default eps,
  spec 2.3, like kv_a_layernorm); NoPE only (mla_use_nope must be true). With mla_use_output_gate the
  concatenated head outputs u are multiplied by sigmoid(g_proj x) (the same x that fed the projections,
  g_proj [n*d_v, D]) before o_proj. Explicit and absorbed forms as kimi_linear.py (the gate sits after
  W_UV, so W_UV cannot be folded into o_proj; the absorbed form here never does).
* KDA: as Kimi Linear but the log decay is, with linear_attn_config.gate_lower_bound lb set,
  a = lb * sigmoid(exp(A_log[h]) (f + dt_bias)) (dt_bias added before the scale; a reparameterization into
  (lb, 0), not a clamp), else Kimi Linear's -exp(A_log[h]) softplus(f + dt_bias); and with
  linear_attn_config.use_full_rank_gate the output gate is self_attn.g_proj x (g_proj [H*K, D], no bias),
  else g_b_proj(g_a_proj x). A_log is stored F32 [head_dim] (K3: [128] for 96 heads; entries past
  num_heads unused, zero in the file) or [num_heads]; canonical_weights returns its first num_heads
  entries. On KDA layers self_attn.g_proj is the KDA output gate, on MLA layers the MLA output gate.
* Stable LatentMoE (spec 4.2) in every layer >= first_k_dense_replace (moe_layer_freq as Kimi Linear):
  route on the full-width x (kimi_linear.route, but experts of dropped groups masked with -inf, not 0.0),
  z = routed_expert_down_proj x [L_a = routed_expert_hidden_size], a = sum_j w_j E_j(z) with
  E_e(z) = w2_e GLU(w1_e z, w3_e z), a = RMSNorm_{routed_expert_norm, rms_norm_eps}(a) when
  latent_moe_use_norm, r = routed_expert_up_proj a, MoE(x) = r + Shared(x) (shared experts on the
  original x, unweighted). hidden_act situ: SiTU-GLU (spec 5, kimi_linear.glu).
* Block Attention Residuals (spec 6.3), the literal loop: blocks = []; per layer i, prefix = h; the
  pre-attention input is Mix(blocks ++ [prefix]) when blocks is non-empty, else prefix; if
  i % attn_res_block_size == 0 the prefix is pushed to blocks and the new partial starts empty; the
  attention output starts or extends the partial; the FFN input is Mix(blocks ++ [partial]); the FFN
  output extends the partial, which is h for the next layer; after the last layer
  y = Mix(blocks ++ [h]) feeds model.norm. Mix(S) = sum_j p_j s_j with p = softmax_j(z), z_j =
  <RMSNorm_{res_norm.weight, rms_norm_eps}(s_j), res_proj.weight[0]> (computed that way, never folded),
  sources raw (delta_family.attn_res_mix, shared with fla's AttnRes). Tensors layers.{i}.self_attention_res_{norm,proj}.weight, mlp_res_{norm,proj}.weight
  ([D], [1, D], in every layer), model.output_attn_res_{norm,proj}.weight.
* MXFP4 (compressed-tensors mxfp4-pack-quantized): a Linear stored as X.weight_packed U8 [rows, cols/2]
  (low nibble = even column; code bit 3 = sign, bits 0-2 index the E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4,
  6) and X.weight_scale U8 [rows, cols/32] (value = code value * 2^(s - 127), E8M0; 255 = NaN is refused)
  is dequantized exactly (dequantize_mxfp4) and used as X.weight.

bf16_inputs (bf16_linear_inputs of the checkpoint) rounds the input of every Linear on a BF16 weight to
bf16, as kimi_linear.py: KDA q/k/v, f_a/f_b, b_proj, g_proj or g_a/g_b, o_proj; MLA q_a_proj, q_b_proj
(its input is the normalized q latent), kv_a_proj_with_mqa, kv_b_proj (explicit form), g_proj, o_proj; the
dense MLP, routed_expert_down_proj / up_proj, the shared experts, lm_head, and every MXFP4 Linear (the
engine's bf16 dot mode takes them too). Not the router gate (float32, as the engine), not the AttnRes
dot products (res_proj: a fold the engine makes in f32)."""

import math
from dataclasses import dataclass, fields
from typing import Optional

import torch

from delta_family import attn_res_mix
from golden_io import recorder
from kimi_linear import (KimiConfig, Weights, _swiglu_specs, glu, initial_cache, kda_mixer,  # noqa: F401
                         low_rank_output_gate, mixer_shapes, mla_mixer, rms_norm, router, routed_experts,
                         shared_experts, softplus_log_decay)

MODEL_TYPE = "kimi_k3"
ARCHITECTURE = "KimiK3ForConditionalGeneration"
TEXT_MODEL_TYPE = "kimi_linear"
TEXT_ARCHITECTURE = "KimiLinearForCausalLM"
TEXT_PREFIX = "language_model."                      # text tensors of the published layout
SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.")  # the published layout's vision model
Q_A_NORM_EPS = 1e-6        # KimiRMSNorm(q_lora_rank): the class default, like kv_a_layernorm (spec 2.3)
MXFP4_FORMAT = "mxfp4-pack-quantized"
MXFP4_GROUP = 32           # columns per E8M0 scale
PACKED_SUFFIX, SCALE_SUFFIX = ".weight_packed", ".weight_scale"
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# text_config fields K3 adds to Kimi Linear's (kimi_linear._REQUIRED); absent ones raise.
_REQUIRED_K3 = ("q_lora_rank", "mla_use_output_gate", "routed_expert_hidden_size", "latent_moe_use_norm",
                "attn_res_block_size", "activation_situ_beta", "activation_situ_linear_beta")


@dataclass(frozen=True)
class K3Config(KimiConfig):
    """KimiConfig plus K3's fields (the linear_attn_config ones without prefix). Build it with from_json."""

    q_lora_rank: int = 0
    mla_use_output_gate: bool = True
    gate_lower_bound: Optional[float] = None
    use_full_rank_gate: bool = False
    routed_expert_hidden_size: int = 0
    latent_moe_use_norm: bool = True
    attn_res_block_size: int = 1
    quantization_format: Optional[str] = None  # quantization_config.format, None without one
    tensor_prefix: str = ""                    # TEXT_PREFIX in the published layout
    q_a_norm_eps: float = Q_A_NORM_EPS         # not a config.json field (spec 2.3)

    @classmethod
    def from_json(cls, d: dict) -> "K3Config":
        """config.json (dict; the published kimi_k3 layout or the text-only kimi_linear one) -> K3Config.
        Raises ValueError on a missing field or an option this reference does not implement."""
        def bad(field, found, expected):
            raise ValueError(f"config.json (kimi_k3): '{field}' is {found!r}, expected {expected}")
        if d.get("model_type") == MODEL_TYPE:
            if d.get("architectures") != [ARCHITECTURE]:
                bad("architectures", d.get("architectures"), [ARCHITECTURE])
            if "text_config" not in d:
                bad("text_config", None, "the text model's config")
            text, prefix = d["text_config"], TEXT_PREFIX
        else:
            text, prefix = d, ""
        if text.get("model_type") != TEXT_MODEL_TYPE:
            bad("model_type", text.get("model_type"), f"{MODEL_TYPE!r} or {TEXT_MODEL_TYPE!r} with K3's fields")
        missing = [k for k in _REQUIRED_K3 if k not in text]
        if missing:
            raise ValueError(f"config.json (kimi_k3): missing fields {missing}")
        if not isinstance(text["q_lora_rank"], int):
            bad("q_lora_rank", text["q_lora_rank"], "an integer (K3's MLA has q-LoRA)")
        if not isinstance(text["routed_expert_hidden_size"], int):
            bad("routed_expert_hidden_size", text["routed_expert_hidden_size"], "an integer (Stable LatentMoE)")
        if text.get("mla_use_nope") is not True:
            bad("mla_use_nope", text.get("mla_use_nope"), "true (K3's MLA is NoPE)")
        lac = text.get("linear_attn_config") or {}
        quant = text.get("quantization_config")
        quant_kind = None if quant is None else (quant.get("quant_method"), quant.get("format"))
        if quant_kind not in (None, ("compressed-tensors", MXFP4_FORMAT)):
            bad("quantization_config (quant_method, format)", quant_kind, f"compressed-tensors {MXFP4_FORMAT}")
        # Kimi Linear's parser for the shared fields, with K3's own ones neutralized (rope_theta and
        # rope_scaling are absent from K3's config and unused under NoPE).
        base = KimiConfig.from_json({"rope_theta": 10000.0, "rope_scaling": None, **text, "q_lora_rank": None,
                                     "mla_use_output_gate": False})
        values = {f.name: getattr(base, f.name) for f in fields(KimiConfig)}
        values.update(
            group_mask=-math.inf, q_lora_rank=text["q_lora_rank"],
            mla_use_output_gate=bool(text["mla_use_output_gate"]),
            gate_lower_bound=(None if lac.get("gate_lower_bound") is None else float(lac["gate_lower_bound"])),
            use_full_rank_gate=bool(lac.get("use_full_rank_gate", False)),
            routed_expert_hidden_size=text["routed_expert_hidden_size"],
            latent_moe_use_norm=bool(text["latent_moe_use_norm"]), attn_res_block_size=text["attn_res_block_size"],
            quantization_format=None if quant is None else quant["format"], tensor_prefix=prefix)
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        super().validate()

        def bad(field, found, expected):
            raise ValueError(f"config.json (kimi_k3): '{field}' is {found!r}, expected {expected}")
        if not isinstance(self.attn_res_block_size, int) or self.attn_res_block_size < 1:
            bad("attn_res_block_size", self.attn_res_block_size, "an integer >= 1 (decoder layers per block)")
        if self.gate_lower_bound is not None and not self.gate_lower_bound < 0:
            bad("linear_attn_config.gate_lower_bound", self.gate_lower_bound, "null or negative")
        if self.num_experts is not None:
            kept = self.topk_group * (self.num_experts // self.num_expert_group)
            if self.num_experts_per_token > kept:  # the -inf mask leaves only the kept groups' experts
                bad("num_experts_per_token", self.num_experts_per_token, f"<= the {kept} experts of the kept groups")

    @property
    def latent_width(self) -> int:
        """L_a: the width the routed experts work in."""
        return self.routed_expert_hidden_size


# ---------------------------------------------------------------------------------------------------
# Checkpoint

def _linear_spec(name: str, rows: int, cols: int) -> tuple:
    return (name + ".weight", [rows, cols], "matrix")


def _kda_specs(cfg: K3Config, a: str, a_log_len: int) -> list:
    H, K, P, D = cfg.kda_num_heads, cfg.kda_head_dim, cfg.kda_dim, cfg.hidden_size
    specs = [_linear_spec(a + c + "_proj", P, D) for c in "qkv"]
    specs += [(f"{a}{c}_conv1d.weight", [P, 1, cfg.conv_size], "conv") for c in "qkv"]
    specs += [(a + "A_log", [a_log_len], "A_log"), (a + "dt_bias", [P], "dt_bias"),
              _linear_spec(a + "f_a_proj", K, D), _linear_spec(a + "f_b_proj", P, K), _linear_spec(a + "b_proj", H, D)]
    if cfg.use_full_rank_gate:
        specs.append(_linear_spec(a + "g_proj", P, D))
    else:
        specs += [_linear_spec(a + "g_a_proj", K, D), _linear_spec(a + "g_b_proj", P, K)]
    return specs + [(a + "o_norm.weight", [K], "norm_weight"), _linear_spec(a + "o_proj", D, P)]


def _mla_specs(cfg: K3Config, a: str) -> list:
    n, D, r, rq = cfg.num_attention_heads, cfg.hidden_size, cfg.kv_lora_rank, cfg.q_lora_rank
    specs = [_linear_spec(a + "q_a_proj", rq, D), (a + "q_a_layernorm.weight", [rq], "norm_weight"),
             _linear_spec(a + "q_b_proj", n * cfg.mla_q_head_dim, rq),
             _linear_spec(a + "kv_a_proj_with_mqa", r + cfg.qk_rope_head_dim, D),
             (a + "kv_a_layernorm.weight", [r], "norm_weight"),
             _linear_spec(a + "kv_b_proj", n * (cfg.qk_nope_head_dim + cfg.v_head_dim), r)]
    if cfg.mla_use_output_gate:
        specs.append(_linear_spec(a + "g_proj", n * cfg.v_head_dim, D))
    return specs + [_linear_spec(a + "o_proj", D, n * cfg.v_head_dim)]


def _latent_moe_specs(cfg: K3Config, m: str) -> list:
    D, E, La = cfg.hidden_size, cfg.num_experts, cfg.latent_width
    specs = [_linear_spec(m + "gate", E, D), (m + "gate.e_score_correction_bias", [E], "router_bias"),
             _linear_spec(m + "routed_expert_down_proj", La, D), _linear_spec(m + "routed_expert_up_proj", D, La)]
    if cfg.latent_moe_use_norm:
        specs.append((m + "routed_expert_norm.weight", [La], "norm_weight"))
    for e in range(E):
        specs += _swiglu_specs(f"{m}experts.{e}.", "w1", "w3", "w2", La, cfg.moe_intermediate_size)
    if cfg.num_shared_experts:
        specs += _swiglu_specs(m + "shared_experts.", "gate_proj", "up_proj", "down_proj", D, cfg.shared_width)
    return specs


def _res_specs(prefix: str, D: int) -> list:
    """An AttnRes mix's RMSNorm weight [D] and pseudo-query [1, D]."""
    return [(prefix + "_norm.weight", [D], "norm_weight"), (prefix + "_proj.weight", [1, D], "res_proj")]


def tensor_specs(cfg: K3Config, a_log_len: Optional[int] = None) -> list:
    """Every text tensor once, by canonical name (without the layout's prefix, MXFP4 weights as their
    dequantized X.weight): (name, shape, kind); kind is "embed", "matrix" (a Linear [out, in]),
    "norm_weight", "res_proj" ([1, D]), "conv" ([C, 1, W]), "A_log", "dt_bias" ([H*K]) or "router_bias".
    a_log_len: A_log's stored length, head_dim (K3) by default or num_heads."""
    D = cfg.hidden_size
    a_log_len = cfg.kda_head_dim if a_log_len is None else a_log_len
    specs = [("model.embed_tokens.weight", [cfg.vocab_size, D], "embed")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", [D], "norm_weight"),
                  (p + "post_attention_layernorm.weight", [D], "norm_weight")]
        specs += _res_specs(p + "self_attention_res", D) + _res_specs(p + "mlp_res", D)
        if cfg.layer_kind(i) == "kda":
            specs += _kda_specs(cfg, p + "self_attn.", a_log_len)
        else:
            specs += _mla_specs(cfg, p + "self_attn.")
        if cfg.ffn_kind(i) == "dense":
            specs += _swiglu_specs(p + "mlp.", "gate_proj", "up_proj", "down_proj", D, cfg.intermediate_size)
        else:
            specs += _latent_moe_specs(cfg, p + "block_sparse_moe.")
    specs += [("model.norm.weight", [D], "norm_weight")] + _res_specs("model.output_attn_res", D)
    if not cfg.tie_word_embeddings:
        specs.append(("lm_head.weight", [cfg.vocab_size, D], "matrix"))
    return specs


def mxfp4_values() -> torch.Tensor:
    """The 16 code values (float64): codes 0-7 the E2M1 magnitudes, 8-15 their negatives (bit 3 = sign)."""
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
    return torch.cat([magnitudes, -magnitudes])


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight_packed U8 [rows, cols/2] (byte j of a row: column 2j in the low nibble, 2j+1 in the high) and
    weight_scale U8 [rows, cols/32] (E8M0: 2^(s - 127) for the 32 columns of group g) -> float64
    [rows, cols], exact."""
    if packed.dtype != torch.uint8 or scale.dtype != torch.uint8:
        raise ValueError(f"MXFP4: weight_packed and weight_scale must be U8, got {packed.dtype}, {scale.dtype}")
    rows, cols = packed.shape[0], 2 * packed.shape[1]
    if cols % MXFP4_GROUP or list(scale.shape) != [rows, cols // MXFP4_GROUP]:
        raise ValueError(f"MXFP4: weight_scale {list(scale.shape)} for weight_packed {list(packed.shape)}")
    if bool((scale == 255).any()):
        raise ValueError("MXFP4: E8M0 scale 255 (NaN)")
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(rows, cols).long()
    powers = torch.tensor([math.ldexp(1.0, s - 127) for s in range(255)], dtype=torch.float64)
    return mxfp4_values()[codes] * powers[scale.long()].repeat_interleave(MXFP4_GROUP, dim=1)


def pack_mxfp4(codes: torch.Tensor, scale: torch.Tensor) -> tuple:
    """codes [rows, cols] (ints 0..15) and E8M0 exponents [rows, cols/32] -> (weight_packed, weight_scale)
    U8, the inverse of dequantize_mxfp4's layout."""
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous(), scale.to(torch.uint8).contiguous()


def text_tensors(cfg: K3Config, tensors: dict) -> dict:
    """Checkpoint tensors -> the text model's under canonical names (prefix stripped, vision skipped,
    MXFP4 pairs dequantized to float64 X.weight). Raises on a packed weight without a
    quantization_config, an unpaired packed/scale tensor, or a name outside the layout."""
    out, packed = {}, {}
    for name, t in tensors.items():
        if cfg.tensor_prefix and name.startswith(SKIPPED_PREFIXES):
            continue
        if not name.startswith(cfg.tensor_prefix):
            raise ValueError(f"kimi_k3: '{name}' is neither a text tensor ('{cfg.tensor_prefix}...') nor vision")
        name = name[len(cfg.tensor_prefix):]
        if name.endswith((PACKED_SUFFIX, SCALE_SUFFIX)):
            packed[name] = t
        else:
            out[name] = t
    for name in sorted(n for n in packed if n.endswith(PACKED_SUFFIX)):
        base = name[:-len(PACKED_SUFFIX)]
        if cfg.quantization_format != MXFP4_FORMAT:
            raise ValueError(f"kimi_k3: '{name}' is packed but config.json has no {MXFP4_FORMAT} quantization_config")
        if base + SCALE_SUFFIX not in packed:
            raise ValueError(f"kimi_k3: '{name}' has no '{base}{SCALE_SUFFIX}'")
        out[base + ".weight"] = dequantize_mxfp4(packed.pop(name), packed.pop(base + SCALE_SUFFIX))
    if packed:
        raise ValueError(f"kimi_k3: scales without packed weights: {sorted(packed)}")
    return out


def canonical_weights(cfg: K3Config, tensors: dict, dtype: torch.dtype) -> dict:
    """Checkpoint tensors (either layout) -> {canonical name: tensor in dtype}, A_log cut to its first
    num_heads entries. Raises on missing, unexpected or misshapen tensors (A_log may be [head_dim] or
    [num_heads])."""
    text = text_tensors(cfg, tensors)
    expected = {name: shape for name, shape, _ in tensor_specs(cfg)}
    if set(text) != set(expected):
        raise ValueError(f"kimi_k3: missing {sorted(set(expected) - set(text))}, "
                         f"unexpected {sorted(set(text) - set(expected))}")
    H = cfg.kda_num_heads
    out = {}
    for name, shape in expected.items():
        t = text[name]
        if name.endswith("A_log"):
            if list(t.shape) not in ([cfg.kda_head_dim], [H]):
                raise ValueError(f"kimi_k3: '{name}' has shape {list(t.shape)}, expected [{cfg.kda_head_dim}] or [{H}]")
            t = t[:H]
        elif list(t.shape) != shape:
            raise ValueError(f"kimi_k3: '{name}' has shape {list(t.shape)}, expected {shape}")
        out[name] = t.to(dtype)
    return out


def bf16_linear_inputs(cfg: K3Config, tensors: dict) -> frozenset:
    """Canonical names of the Linears whose input the engine's bf16 dot products round: every BF16
    "matrix" tensor except the router gate (float32), and every MXFP4 one (its values are exact in bf16,
    and the engine's bf16 dot mode multiplies them so)."""
    matrices = {name for name, _, kind in tensor_specs(cfg) if kind == "matrix"}
    p = cfg.tensor_prefix
    bf16 = {name[len(p):] for name, t in tensors.items() if t.dtype == torch.bfloat16 and name.startswith(p)}
    mxfp4 = {name[len(p):-len(PACKED_SUFFIX)] + ".weight" for name in tensors
             if name.startswith(p) and name.endswith(PACKED_SUFFIX)}
    return frozenset(n for n in (bf16 | mxfp4) & matrices if not n.endswith("block_sparse_moe.gate.weight"))


# ---------------------------------------------------------------------------------------------------
# Mixers: K3's pieces for kimi_linear's KDA and MLA

def k3_log_decay(cfg: K3Config, w: Weights, p: str, f: torch.Tensor) -> torch.Tensor:
    """a [T, H, K] from f [T, H, K]: lb * sigmoid(exp(A_log[h]) (f + dt_bias)) with gate_lower_bound lb,
    else Kimi Linear's -exp(A_log[h]) softplus(f + dt_bias)."""
    if cfg.gate_lower_bound is None:
        return softplus_log_decay(cfg, w, p, f)
    H, K = cfg.kda_num_heads, cfg.kda_head_dim
    scale = torch.exp(w[p + "A_log"].reshape(H))[:, None]
    return cfg.gate_lower_bound * torch.sigmoid(scale * (f + w[p + "dt_bias"].reshape(H, K)))


def k3_kda_output_gate(cfg: K3Config, w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    """KDA output gate logits [T, H*K]: g_proj x (use_full_rank_gate) or g_b_proj(g_a_proj x)."""
    return w.linear(x, p + "g_proj.weight") if cfg.use_full_rank_gate else low_rank_output_gate(cfg, w, p, x)


def q_lora_query(cfg: K3Config, w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    """q = q_b_proj RMSNorm_{q_a_layernorm, 1e-6}(q_a_proj x), [T, n*(d_n+d_r)]."""
    q_latent = rms_norm(w.linear(x, p + "q_a_proj.weight"), w[p + "q_a_layernorm.weight"], cfg.q_a_norm_eps)
    return w.linear(q_latent, p + "q_b_proj.weight")


def mla_output_gate(cfg: K3Config, w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    """Gated MLA's gate logits g_proj x, [T, n*d_v]."""
    return w.linear(x, p + "g_proj.weight")


def latent_moe(cfg: K3Config, w: Weights, p: str, x: torch.Tensor, rec) -> tuple:
    """Stable LatentMoE (spec 4.2), x [T, D] (after post_attention_layernorm) -> (output [T, D], Routing)."""
    sel = router(cfg, w, p, x, rec)
    z = rec("moe.latent", w.linear(x, p + "routed_expert_down_proj.weight"))
    a = routed_experts(cfg, w, p, z, sel)
    if cfg.latent_moe_use_norm:
        a = rms_norm(a, w[p + "routed_expert_norm.weight"], cfg.rms_norm_eps)
    out = rec("moe.routed", w.linear(a, p + "routed_expert_up_proj.weight"))
    if cfg.num_shared_experts:
        out = out + rec("moe.shared", shared_experts(cfg, w, p, x))
    return rec("moe.out", out), sel


# ---------------------------------------------------------------------------------------------------
# The model

def k3_forward(cfg: K3Config, w: dict, tokens: torch.Tensor, record: Optional[dict] = None,
               cache: Optional[list] = None, bf16_inputs: frozenset = frozenset(), mla_form: str = "explicit",
               routing: Optional[list] = None) -> torch.Tensor:
    """tokens [T] int -> logits [T, vocab], in the dtype of w (from canonical_weights); the arguments as
    kimi_linear.kimi_forward (cache from kimi_linear.initial_cache: AttnRes keeps no state across tokens)."""
    rec = recorder(record)

    w = Weights(w, bf16_inputs)
    dtype = w["model.embed_tokens.weight"].dtype
    if cache is None:
        cache = initial_cache(cfg, dtype)
    eps = cfg.rms_norm_eps
    h = rec("embed", w["model.embed_tokens.weight"][tokens])
    blocks = []
    for i in range(cfg.num_hidden_layers):
        p, n = f"model.layers.{i}.", f"h{i}."
        lrec = (lambda prefix: lambda name, t: rec(prefix + name, t))(n)
        prefix = h
        if blocks:
            x, weights = attn_res_mix(blocks + [prefix], w[p + "self_attention_res_norm.weight"],
                                      w[p + "self_attention_res_proj.weight"], eps)
            lrec("attn_res.weights", weights)
        else:
            x = prefix
        if i % cfg.attn_res_block_size == 0:
            blocks.append(prefix)
            prefix = None
        a = lrec("input_layernorm", rms_norm(x, w[p + "input_layernorm.weight"], eps))
        if cfg.layer_kind(i) == "kda":
            o = kda_mixer(cfg, w, p + "self_attn.", a, cache[i], lrec, k3_log_decay, k3_kda_output_gate)
        else:
            o = mla_mixer(cfg, w, p + "self_attn.", a, cache[i], lrec, mla_form, q_lora_query,
                          mla_output_gate if cfg.mla_use_output_gate else None)
        o = lrec("attn.out", o)
        prefix = lrec("resid_mid", o if prefix is None else prefix + o)
        x, weights = attn_res_mix(blocks + [prefix], w[p + "mlp_res_norm.weight"], w[p + "mlp_res_proj.weight"], eps)
        lrec("mlp_res.weights", weights)
        m = lrec("post_attention_layernorm", rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
        if cfg.ffn_kind(i) == "dense":
            mp = p + "mlp."
            f = lrec("mlp.out", glu(cfg, w, m, mp + "gate_proj.weight", mp + "up_proj.weight", mp + "down_proj.weight"))
        else:
            f, sel = latent_moe(cfg, w, p + "block_sparse_moe.", m, lrec)
            if routing is not None:
                routing.append((i, sel))
        h = lrec("out", prefix + f)
    y, weights = attn_res_mix(blocks + [h], w["model.output_attn_res_norm.weight"],
                              w["model.output_attn_res_proj.weight"], eps)
    rec("output_res.weights", weights)
    y = rec("norm", rms_norm(y, w["model.norm.weight"], eps))
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    return rec("logits", w.linear(y, head))


def intermediate_shapes(cfg: K3Config, T: int) -> list:
    """The names k3_forward records, in forward order, with their shapes: the golden-data contract.
    attn_res.weights / mlp_res.weights / output_res.weights are [T, S], S = the mix's sources (blocks,
    then the current partial)."""
    D, blocks = cfg.hidden_size, 0
    out = [("embed", [T, D])]
    for i in range(cfg.num_hidden_layers):
        n = f"h{i}."
        if blocks:
            out.append((n + "attn_res.weights", [T, blocks + 1]))
        blocks += i % cfg.attn_res_block_size == 0
        out.append((n + "input_layernorm", [T, D]))
        out += mixer_shapes(cfg, i, T)
        out += [(n + "attn.out", [T, D]), (n + "resid_mid", [T, D]), (n + "mlp_res.weights", [T, blocks + 1]),
                (n + "post_attention_layernorm", [T, D])]
        if cfg.ffn_kind(i) == "dense":
            out.append((n + "mlp.out", [T, D]))
        else:
            k = cfg.num_experts_per_token
            out += [(n + "moe.router_logits", [T, cfg.num_experts]), (n + "moe.expert_ids", [T, k]),
                    (n + "moe.expert_weights", [T, k]), (n + "moe.latent", [T, cfg.latent_width]),
                    (n + "moe.routed", [T, D])]
            if cfg.num_shared_experts:
                out.append((n + "moe.shared", [T, D]))
            out.append((n + "moe.out", [T, D]))
        out.append((n + "out", [T, D]))
    return out + [("output_res.weights", [T, blocks + 1]), ("norm", [T, D]), ("logits", [T, cfg.vocab_size])]
