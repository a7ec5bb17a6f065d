"""Linear-attention family prefill forward in plain PyTorch (fla LinearAttention, DeltaNet, GatedDeltaNet,
KimiDeltaAttention inside fla's *ForCausalLM), written from docs spec linear-attention-family.md.
The golden reference for the C++ linear_attn / delta_net / gated_deltanet / kda paths: every token mixer
runs the naive token-by-token recurrence of spec section 1.5 (never a chunked form), in the dtype of the
weights it is given (float64 for goldens), and records every named intermediate. With bf16_inputs it also
emulates the engine's bf16 dot products (the input of each Linear on a BF16 weight rounded to bf16).

Block Attention Residuals (config attnres_block_size B, fla's <Type>Block / <Type>Model at bc3b101d, the same
in all four model types): B counts sublayers, 2i = layer i's attention, 2i+1 its MLP; fla allows B = 1 (full
AttnRes: every sublayer output its own source) or an even B (B/2 layers per block). The residual stream is
replaced by a list of block sums (the embedding first) and a running partial sum x: before sublayer j the
sources are blocks ++ [x] (layer 0's attention: no blocks yet, its input is the embedding); at a boundary
(j % B == 0) they become the blocks and x restarts empty; the sublayer's input is RMSNorm_{attn_norm or
mlp_norm}(Mix(sources)) (fla fuses that norm into fused_attnres, same eps norm_eps); its output starts or
extends x. After the last layer model.norm takes Mix(blocks ++ [x]). Mix = attn_res_mix (spec 6.3, also
kimi_k3.py's) with eps norm_eps. Tensors model.layers.{i}.{attn,mlp}_res_proj.weight [1, D] (no bias),
{attn,mlp}_res_norm.weight [D], model.res_proj.weight [1, D], model.res_norm.weight [D]. For even B this is
Kimi K3's loop with attn_res_block_size B/2 (no MLP ever starts a block); B = 1 has no K3 counterpart."""

from dataclasses import dataclass, fields
from typing import Optional

import torch

from golden_io import recorder

MODEL_TYPES = ("linear_attn", "delta_net", "gated_deltanet", "kda")

ARCHITECTURES = {
    "linear_attn": "LinearAttentionForCausalLM",
    "delta_net": "DeltaNetForCausalLM",
    "gated_deltanet": "GatedDeltaNetForCausalLM",
    "kda": "KDAForCausalLM",
}

# fla's configuration-class defaults (fla/models/<type>/configuration_<type>.py at bc3b101d): the fields
# shared by all four, then each model type's own. A config.json field left out takes these values.
COMMON_DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 2048, "hidden_ratio": 4, "intermediate_size": None,
    "hidden_act": "swish", "norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 2048,
    "attn": None, "attnres_block_size": None, "use_cache": True, "initializer_range": 0.02,
    "fuse_norm": True, "fuse_swiglu": True, "fuse_cross_entropy": True, "use_l2warp": False,
    "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
}
MIXER_DEFAULTS = {
    "linear_attn": {
        "attn_mode": "fused_chunk", "expand_k": 1.0, "expand_v": 1.0, "num_heads": 4, "num_kv_heads": None,
        "feature_map": "elementwise_product", "tie_feature_map_qk": False, "norm_q": False, "norm_k": False,
        "norm_feature_map": False, "elementwise_affine": True, "num_hidden_layers": 24,
        "fuse_linear_cross_entropy": False,
    },
    "delta_net": {
        "attn_mode": "chunk", "expand_k": 1.0, "expand_v": 1.0, "use_gate": False, "use_short_conv": True,
        "allow_neg_eigval": False, "conv_size": 4, "use_beta": True, "use_output_norm": True, "num_heads": 16,
        "qk_norm": "l2", "qk_activation": "silu", "num_hidden_layers": 24, "fuse_linear_cross_entropy": False,
    },
    "gated_deltanet": {
        "attn_mode": "chunk", "expand_v": 2.0, "use_gate": True, "use_short_conv": True,
        "allow_neg_eigval": False, "conv_size": 4, "head_dim": 256, "num_heads": 6, "num_v_heads": None,
        "num_hidden_layers": 21, "fuse_linear_cross_entropy": False,
    },
    "kda": {
        "attn_mode": "chunk", "expand_v": 1.0, "use_short_conv": True, "allow_neg_eigval": False,
        "safe_gate": False, "lower_bound": None, "conv_size": 4, "head_dim": 128, "num_heads": 16,
        "num_v_heads": None, "num_hidden_layers": 24,
    },
}

L2_EPS = 1e-6            # fla l2norm: x / sqrt(sum x^2 + 1e-6), eps inside the sqrt (spec 1.2)
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this (fla/ops/utils/softplus.py, torch default)
NORMALIZER_EPS = 1e-10   # linear attention normaliser: o / (scale q.z + 1e-10) (fla/ops/linear_attn)
NORM_QK_EPS = 1e-4       # linear attention norm_q / norm_k: x / (sum x + 1e-4) (fla/layers/linear_attn.py)


@dataclass(frozen=True)
class FlaConfig:
    """The fla config fields the forward depends on, with fla's names. Fields a model type does not have
    keep a neutral value. Build it with from_json, which fills in fla's defaults for the model type."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_heads: int
    hidden_ratio: Optional[int] = 4
    intermediate_size: Optional[int] = None
    hidden_act: str = "swish"
    norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    expand_k: float = 1.0                  # linear_attn, delta_net: key_dim = int(hidden_size * expand_k)
    expand_v: float = 1.0                  # value_dim = int(hidden_size * expand_v); or V = K * it
    head_dim: Optional[int] = None         # gated_deltanet, kda: K
    num_kv_heads: Optional[int] = None     # linear_attn: heads of k_proj / v_proj (GQA)
    num_v_heads: Optional[int] = None      # gated_deltanet, kda: HV (GVA)
    use_short_conv: bool = False
    conv_size: int = 4
    use_gate: bool = False
    use_beta: bool = True
    allow_neg_eigval: bool = False
    qk_activation: str = "silu"
    qk_norm: str = "l2"
    feature_map: str = "elementwise_product"
    tie_feature_map_qk: bool = False
    norm_q: bool = False
    norm_k: bool = False
    norm_feature_map: bool = False
    elementwise_affine: bool = True
    safe_gate: bool = False
    lower_bound: Optional[float] = None
    attn: Optional[dict] = None
    attnres_block_size: Optional[int] = None

    @classmethod
    def from_json(cls, d: dict) -> "FlaConfig":
        """config.json (dict) -> FlaConfig, fla defaults for absent fields. Raises ValueError on a model
        type or option this reference does not implement."""
        model_type = d.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"config.json: model_type {model_type!r}, expected one of {MODEL_TYPES}")
        merged = {**COMMON_DEFAULTS, **MIXER_DEFAULTS[model_type], **d}
        names = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in merged.items() if k in names})
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def bad(field, found, expected):
            raise ValueError(f"config.json ({self.model_type}): '{field}' is {found!r}, expected {expected}")
        if self.attn is not None:
            bad("attn", self.attn, "null (hybrid softmax-attention layers are not part of this reference)")
        b = self.attnres_block_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or (b != 1 and (b < 2 or b % 2))):
            bad("attnres_block_size", b, "null, 1 (full AttnRes) or an even integer >= 2 (sublayers per block; "
                "fla's configuration classes allow nothing else)")
        if self.hidden_act != "swish":
            bad("hidden_act", self.hidden_act, "'swish' (fla GatedMLP accepts nothing else)")
        if self.model_type == "linear_attn":
            if self.feature_map not in ("elementwise_product", "elu", "relu", "identity"):
                bad("feature_map", self.feature_map, "elementwise_product, elu, relu or identity")
            if self.tie_feature_map_qk and self.feature_map == "elementwise_product":
                bad("tie_feature_map_qk", True, "false (shared feature-map tensors are not implemented)")
            if self.num_heads % self.kv_proj_heads:
                bad("num_kv_heads", self.num_kv_heads, f"a divisor of num_heads {self.num_heads}")
            if self.use_short_conv and self.kv_proj_heads != self.num_heads:
                bad("use_short_conv", True, "false with num_kv_heads < num_heads")
        if self.model_type == "delta_net":
            if self.qk_activation not in ("silu", "relu", "elu", "identity"):
                bad("qk_activation", self.qk_activation, "silu, relu, elu or identity")
            if self.qk_norm not in ("l2", "sum"):
                bad("qk_norm", self.qk_norm, "l2 or sum")
        if self.model_type == "kda" and self.lower_bound is not None and not self.lower_bound < 0:
            bad("lower_bound", self.lower_bound, "null or negative")
        if self.v_heads % self.num_heads:
            bad("num_v_heads", self.num_v_heads, f"a multiple of num_heads {self.num_heads}")
        if self.key_dim % self.num_heads:
            bad("expand_k", self.expand_k, f"a key dim {self.key_dim} divisible by {self.num_heads} heads")
        if self.value_dim % self.v_heads:
            bad("expand_v", self.expand_v, f"a value dim {self.value_dim} divisible by {self.v_heads} heads")

    @property
    def decay_kind(self) -> str:
        """'none' (linear_attn, delta_net), 'head' (GDN: one log decay per v-head), 'channel' (KDA)."""
        return {"gated_deltanet": "head", "kda": "channel"}.get(self.model_type, "none")

    @property
    def has_delta(self) -> bool:
        return self.model_type != "linear_attn"

    @property
    def key_dim(self) -> int:
        """Width of q_proj: H * K."""
        if self.model_type in ("gated_deltanet", "kda"):
            return self.num_heads * self.head_dim
        return int(self.hidden_size * self.expand_k)

    @property
    def value_dim(self) -> int:
        """Width of the mixer output before o_proj: HV * V."""
        if self.model_type in ("gated_deltanet", "kda"):
            return self.v_heads * int(self.head_dim * self.expand_v)
        return int(self.hidden_size * self.expand_v)

    @property
    def v_heads(self) -> int:
        """HV: heads of the state and output (q/k head j // (HV / H) serves v-head j)."""
        if self.model_type in ("gated_deltanet", "kda"):
            return self.num_v_heads if self.num_v_heads is not None else self.num_heads
        return self.num_heads

    @property
    def kv_proj_heads(self) -> int:
        """linear_attn: heads produced by k_proj / v_proj before the GQA repeat; else H."""
        if self.model_type == "linear_attn" and self.num_kv_heads is not None:
            return self.num_kv_heads
        return self.num_heads

    @property
    def head_k_dim(self) -> int:
        return self.key_dim // self.num_heads

    @property
    def head_v_dim(self) -> int:
        return self.value_dim // self.v_heads

    @property
    def mlp_width(self) -> int:
        """fla GatedMLP: intermediate_size, else int(2/3 * hidden_ratio * hidden) rounded up to 256s."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        ratio = self.hidden_ratio if self.hidden_ratio is not None else 4
        f = int(self.hidden_size * ratio * 2 / 3)
        return 256 * ((f + 255) // 256)

    @property
    def conv_channels(self) -> dict:
        """Short-conv channels per projection, or {} without short convs. fla's linear_attn never has them;
        lineage's use_short_conv gives it the same three (no GQA), with no activation after them."""
        if not self.use_short_conv:
            return {}
        return {"q": self.key_dim, "k": self.key_dim, "v": self.value_dim}


def _attn_specs(cfg: FlaConfig, p: str) -> list:
    """The mixer's tensors in fla module order: (name, shape, kind); Linear weights are [out, in]."""
    D, H, HV, K, V = cfg.hidden_size, cfg.num_heads, cfg.v_heads, cfg.head_k_dim, cfg.head_v_dim
    W = cfg.conv_size
    if cfg.model_type == "linear_attn":
        specs = []
        if cfg.feature_map == "elementwise_product":
            for fm in ("feature_map_q", "feature_map_k"):
                for layer in ("layer1", "layer2"):
                    specs += [(f"{p}{fm}.{layer}.weight", [K, K], "matrix"),
                              (f"{p}{fm}.{layer}.bias", [K], "bias")]
        HKV = cfg.kv_proj_heads
        specs += [(p + "q_proj.weight", [H * K, D], "matrix"), (p + "k_proj.weight", [HKV * K, D], "matrix"),
                  (p + "v_proj.weight", [HKV * V, D], "matrix")]
        specs += [(f"{p}{c}_conv1d.weight", [n, 1, W], "conv") for c, n in cfg.conv_channels.items()]
        if cfg.elementwise_affine:
            specs.append((p + "norm.weight", [V], "norm_weight"))
        return specs + [(p + "o_proj.weight", [D, H * V], "matrix")]

    specs = [(p + "q_proj.weight", [H * K, D], "matrix"), (p + "k_proj.weight", [H * K, D], "matrix"),
             (p + "v_proj.weight", [HV * V, D], "matrix")]
    convs = [(f"{p}{c}_conv1d.weight", [n, 1, W], "conv") for c, n in cfg.conv_channels.items()]
    if cfg.model_type == "delta_net":
        if cfg.use_beta:
            specs.append((p + "b_proj.weight", [H, D], "matrix"))
        specs += convs
        if cfg.use_gate:
            specs.append((p + "g_proj.weight", [HV * V, D], "matrix"))
    elif cfg.model_type == "gated_deltanet":
        specs += [(p + "a_proj.weight", [HV, D], "matrix"), (p + "b_proj.weight", [HV, D], "matrix"),
                  (p + "A_log", [HV], "A_log"), (p + "dt_bias", [HV], "dt_bias")] + convs
        if cfg.use_gate:
            specs.append((p + "g_proj.weight", [HV * V, D], "matrix"))
    else:  # kda
        specs += convs + [
            (p + "f_proj.0.weight", [V, D], "matrix"), (p + "f_proj.1.weight", [HV * K, V], "matrix"),
            (p + "b_proj.weight", [HV, D], "matrix"), (p + "A_log", [HV], "A_log"),
            (p + "dt_bias", [HV * K], "dt_bias"), (p + "g_proj.0.weight", [V, D], "matrix"),
            (p + "g_proj.1.weight", [HV * V, V], "matrix"), (p + "g_proj.1.bias", [HV * V], "bias")]
    return specs + [(p + "o_norm.weight", [V], "norm_weight"), (p + "o_proj.weight", [D, HV * V], "matrix")]


def _res_specs(prefix: str, D: int) -> list:
    """An fla AttnRes mix's pseudo-query nn.Linear(D, 1, bias=False) [1, D] and key nn.RMSNorm(D) [D], in
    fla's module order (proj first)."""
    return [(prefix + "_proj.weight", [1, D], "res_proj"), (prefix + "_norm.weight", [D], "norm_weight")]


def tensor_specs(cfg: FlaConfig) -> list:
    """Every checkpoint tensor once, in module order: (name, shape, kind). kind is "embed", "matrix",
    "norm_weight", "conv" ([C, 1, W] depthwise), "bias", "A_log", "dt_bias" or "res_proj" (an AttnRes
    pseudo-query [1, D]; with attnres_block_size, per layer after the MLP and model-level after model.norm)."""
    D, F = cfg.hidden_size, cfg.mlp_width
    specs = [("model.embeddings.weight", [cfg.vocab_size, D], "embed")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        specs.append((p + "attn_norm.weight", [D], "norm_weight"))
        specs += _attn_specs(cfg, p + "attn.")
        specs += [(p + "mlp_norm.weight", [D], "norm_weight"), (p + "mlp.gate_proj.weight", [F, D], "matrix"),
                  (p + "mlp.up_proj.weight", [F, D], "matrix"),
                  (p + "mlp.down_proj.weight", [D, F], "matrix")]
        if cfg.attnres_block_size is not None:
            specs += _res_specs(p + "attn_res", D) + _res_specs(p + "mlp_res", D)
    specs.append(("model.norm.weight", [D], "norm_weight"))
    if cfg.attnres_block_size is not None:
        specs += _res_specs("model.res", D)
    if not cfg.tie_word_embeddings:
        specs.append(("lm_head.weight", [cfg.vocab_size, D], "matrix"))
    return specs


def canonical_weights(cfg: FlaConfig, tensors: dict, dtype: torch.dtype) -> dict:
    """Checkpoint tensors -> {name: tensor in dtype}. Raises on missing, unexpected or misshapen tensors
    (a tied model must not carry lm_head.weight: save_pretrained drops the tied copy)."""
    expected = {name: shape for name, shape, _ in tensor_specs(cfg)}
    if set(tensors) != set(expected):
        raise ValueError(f"{cfg.model_type}: missing {sorted(set(expected) - set(tensors))}, "
                         f"unexpected {sorted(set(tensors) - set(expected))}")
    for name, shape in expected.items():
        if list(tensors[name].shape) != shape:
            raise ValueError(f"{cfg.model_type}: '{name}' has shape {list(tensors[name].shape)}, "
                             f"expected {shape}")
    return {name: t.to(dtype) for name, t in tensors.items()}


def bf16_weight_names(tensors: dict) -> frozenset:
    """Names of the checkpoint tensors stored in BF16: the bf16_inputs of fla_forward that emulate the
    engine's bf16 dot products."""
    return frozenset(name for name, t in tensors.items() if t.dtype == torch.bfloat16)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bf16 (ties to even), back in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


class Weights(dict):
    """name -> tensor (from canonical_weights) as the forward reads them, and how it applies a Linear."""

    def __init__(self, tensors: dict, bf16_inputs: frozenset = frozenset()):
        super().__init__(tensors)
        self.bf16_inputs = bf16_inputs

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x [..., in] @ W^T, W = self[name] [out, in]. A weight named in bf16_inputs takes x rounded to
        bf16 (the engine rounds the input of every linear on it, a low-rank pair's middle included)."""
        return (round_bf16(x) if name in self.bf16_inputs else x) @ self[name].T


# ---------------------------------------------------------------------------------------------------
# Building blocks (spec section 1)

def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """Over the last axis: x / sqrt(mean(x^2) + eps) * weight (weight None: elementwise_affine false)."""
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def attn_res_mix(sources: list, norm_weight: torch.Tensor, proj_weight: torch.Tensor, eps: float) -> tuple:
    """Block AttnRes Mix (spec 6.3; fla naive_attnres without its output RMSNorm) over sources
    [s_0 .. s_{S-1}], each [T, D]: z_j = RMSNorm_{norm_weight, eps}(s_j) . proj_weight[0], p = softmax over j,
    returns (sum_j p_j s_j [T, D] of the raw sources, p [T, S])."""
    stacked = torch.stack(sources)                                    # [S, T, D]
    z = (rms_norm(stacked, norm_weight, eps) * proj_weight[0]).sum(dim=-1)  # [S, T]
    p = torch.softmax(z, dim=0)
    return (p[:, :, None] * stacked).sum(dim=0), p.T


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(x)), and x itself above 20 (fla's and torch's threshold)."""
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x.clamp(max=SOFTPLUS_THRESHOLD))))


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Over the last axis: x / sqrt(sum(x^2) + 1e-6)."""
    return x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2_EPS)


def short_conv(x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor, activate: bool):
    """Causal depthwise conv (fla ShortConvolution, bias-free). x [T, C] raw projections, weight [C, 1, W],
    tail [W-1, C] the raw inputs before x (zeros at sequence start). Returns y [T, C] with
    y_t = act(sum_j weight[:, 0, j] * x_{t-W+1+j}) (tap W-1 is the current token, act SiLU or none),
    and the new tail [W-1, C] = the last W-1 raw inputs."""
    T, W = x.shape[0], weight.shape[-1]
    padded = torch.cat([tail, x], dim=0)  # [W-1+T, C]
    y = sum(padded[j:j + T] * weight[:, 0, j] for j in range(W))
    return (silu(y) if activate else y), padded[padded.shape[0] - (W - 1):]


def gated_delta_recurrent(q, k, v, beta, log_decay, S):
    """The recurrence of spec 1.5, one token at a time, all v-heads at once:
        S~ = decay_t(S_{t-1}); u_t = beta_t (v_t - S~^T k_t) (or u_t = v_t when beta is None: linear
        attention's additive write); S_t = S~ + k_t u_t^T; o_t = S_t^T q_t.
    q, k [T, HV, K] (already normalised, q already scaled, q/k heads already repeated for GVA),
    v [T, HV, V], beta [T, HV] or None, log_decay None, [T, HV] (GDN) or [T, HV, K] (KDA: row d of S
    decays by exp(a_t[d])), S [HV, K, V] the initial state. Returns o [T, HV, V] and S_T [HV, K, V]."""
    o = torch.empty(v.shape, dtype=v.dtype)
    for t in range(q.shape[0]):
        if log_decay is not None:
            a = log_decay[t]
            S = S * torch.exp(a)[:, None, None] if a.dim() == 1 else S * torch.exp(a)[:, :, None]
        if beta is None:
            u = v[t]
        else:
            u = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", k[t], S))
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", q[t], S)
    return o, S


def initial_cache(cfg: FlaConfig, dtype: torch.dtype) -> list:
    """Per layer the state a sequence starts from: conv tails (last W-1 raw q/k/v projections, [W-1, C]),
    S [HV, K, V] and, for normalised linear attention, the key sum z [H, K]; all zeros."""
    HV, K, V, W = cfg.v_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_size
    cache = []
    for _ in range(cfg.num_hidden_layers):
        layer = {"conv": {c: torch.zeros(W - 1, n, dtype=dtype) for c, n in cfg.conv_channels.items()},
                 "S": torch.zeros(HV, K, V, dtype=dtype)}
        if cfg.model_type == "linear_attn" and cfg.norm_feature_map:
            layer["z"] = torch.zeros(cfg.num_heads, K, dtype=dtype)
        cache.append(layer)
    return cache


# ---------------------------------------------------------------------------------------------------
# Token mixers (spec sections 2-5)

def _feature_map(cfg: FlaConfig, w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    """fla LinearAttention feature map on [T, H, K] (spec 2.2)."""
    if cfg.feature_map == "elementwise_product":
        l1, l2 = name + ".layer1.", name + ".layer2."
        return (w.linear(x, l2 + "weight") + w[l2 + "bias"]) * (w.linear(x, l1 + "weight") + w[l1 + "bias"])
    if cfg.feature_map == "elu":
        return torch.nn.functional.elu(x) + 1.0
    if cfg.feature_map == "relu":
        return torch.relu(x)
    return x


def linear_attention(cfg: FlaConfig, w: Weights, p: str, x: torch.Tensor, state: dict, rec) -> torch.Tensor:
    """fla LinearAttention, x [T, D] (after attn_norm) -> [T, D]. Heads of k_proj/v_proj are repeated
    consecutively to the H query heads; scale K^-0.5; optional normaliser o / (scale q.z_t + 1e-10)."""
    T, H, K, V = x.shape[0], cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
    G = H // cfg.kv_proj_heads
    proj = {c: w.linear(x, f"{p}{c}_proj.weight") for c in ("q", "k", "v")}
    for c in cfg.conv_channels:  # lineage's use_short_conv: no activation
        proj[c], state["conv"][c] = short_conv(proj[c], w[f"{p}{c}_conv1d.weight"], state["conv"][c], False)
    q = proj["q"].reshape(T, H, K)
    k = proj["k"].reshape(T, H // G, K).repeat_interleave(G, dim=1)
    v = proj["v"].reshape(T, H // G, V).repeat_interleave(G, dim=1)
    q = _feature_map(cfg, w, p + "feature_map_q", q)
    k = _feature_map(cfg, w, p + "feature_map_k", k)
    rec("attn.q", q.reshape(T, H * K))
    rec("attn.k", k.reshape(T, H * K))
    rec("attn.v", v.reshape(T, H * V))
    if cfg.norm_q:
        q = q / (q.sum(dim=-1, keepdim=True) + NORM_QK_EPS)
    if cfg.norm_k:
        k = k / (k.sum(dim=-1, keepdim=True) + NORM_QK_EPS)
    q = q * K ** -0.5
    o, state["S"] = gated_delta_recurrent(q, k, v, None, None, state["S"])
    if cfg.norm_feature_map:
        z = state["z"] + k.cumsum(dim=0)  # [T, H, K]: running key sum including token t
        o = o / ((q * z).sum(dim=-1, keepdim=True) + NORMALIZER_EPS)
        state["z"] = z[-1]
    rec("attn.core", o.reshape(T, H * V))
    rec("attn.state", state["S"])
    o = rms_norm(o, w.get(p + "norm.weight"), cfg.norm_eps)
    return w.linear(o.reshape(T, H * V), p + "o_proj.weight")


def _qkv_delta(cfg: FlaConfig, w: Weights, p: str, x: torch.Tensor, state: dict):
    """q, k [T, H*K], v [T, HV*V] of the delta mixers: projection, short conv (SiLU on q/k only when the
    q/k activation is silu; always on v), or plain SiLU without short convs."""
    qk_silu = cfg.model_type != "delta_net" or cfg.qk_activation == "silu"
    out = {}
    for c in ("q", "k", "v"):
        raw = w.linear(x, f"{p}{c}_proj.weight")
        activate = qk_silu or c == "v"
        if cfg.conv_channels:
            out[c], state["conv"][c] = short_conv(raw, w[f"{p}{c}_conv1d.weight"], state["conv"][c], activate)
        else:
            out[c] = silu(raw) if activate else raw
    return out["q"], out["k"], out["v"]


def _log_decay(cfg: FlaConfig, w: Weights, p: str, x: torch.Tensor):
    """a_t <= 0: None (DeltaNet); GDN [T, HV] = -exp(A_log) softplus(a_proj(x) + dt_bias);
    KDA [T, HV, K] = -exp(A_log[h]) softplus(f_proj(x)[h, d] + dt_bias[h*K + d]), or with lower_bound
    (fla's lower-bound gate, spec 1.4) lower_bound * sigmoid(exp(A_log[h]) (f_proj(x)[h, d] + dt_bias[h*K + d])),
    in (lower_bound, 0)."""
    HV, K = cfg.v_heads, cfg.head_k_dim
    if cfg.decay_kind == "head":
        return -torch.exp(w[p + "A_log"]) * softplus(w.linear(x, p + "a_proj.weight") + w[p + "dt_bias"])
    if cfg.decay_kind == "channel":
        f = w.linear(w.linear(x, p + "f_proj.0.weight"), p + "f_proj.1.weight").reshape(-1, HV, K)
        A, biased = torch.exp(w[p + "A_log"])[:, None], f + w[p + "dt_bias"].reshape(HV, K)
        if cfg.lower_bound is not None:
            return cfg.lower_bound * torch.sigmoid(A * biased)
        return -A * softplus(biased)
    return None


def _output_norm(cfg: FlaConfig, w: Weights, p: str, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """o [T, HV, V] -> per-head RMSNorm(o) * o_norm.weight, times the output gate: swish(g_proj(x)) for
    DeltaNet/GDN with use_gate, sigmoid(g_proj.1(g_proj.0(x)) + bias) for KDA, none otherwise."""
    T, HV, V = o.shape
    y = rms_norm(o, w[p + "o_norm.weight"], cfg.norm_eps)
    if cfg.model_type == "kda":
        g = w.linear(w.linear(x, p + "g_proj.0.weight"), p + "g_proj.1.weight") + w[p + "g_proj.1.bias"]
        return y * torch.sigmoid(g.reshape(T, HV, V))
    if cfg.use_gate:
        return y * silu(w.linear(x, p + "g_proj.weight").reshape(T, HV, V))
    return y


def delta_mixer(cfg: FlaConfig, w: Weights, p: str, x: torch.Tensor, state: dict, rec) -> torch.Tensor:
    """fla DeltaNet / GatedDeltaNet / KimiDeltaAttention, x [T, D] (after attn_norm) -> [T, D]; they differ
    only in the q/k activation and norm, the decay (none / per head / per channel) and the output gate."""
    T, H, HV, K, V = x.shape[0], cfg.num_heads, cfg.v_heads, cfg.head_k_dim, cfg.head_v_dim
    q, k, v = _qkv_delta(cfg, w, p, x, state)
    q, k, v = q.reshape(T, H, K), k.reshape(T, H, K), v.reshape(T, HV, V)
    if cfg.model_type == "delta_net" and cfg.qk_activation == "relu":
        q, k = torch.relu(q), torch.relu(k)
    elif cfg.model_type == "delta_net" and cfg.qk_activation == "elu":
        q, k = torch.nn.functional.elu(q) + 1.0, torch.nn.functional.elu(k) + 1.0
    rec("attn.q", q.reshape(T, H * K))
    rec("attn.k", k.reshape(T, H * K))
    rec("attn.v", v.reshape(T, HV * V))
    if cfg.model_type == "delta_net" and cfg.qk_norm == "sum":
        q, k = q / q.sum(dim=-1, keepdim=True), k / k.sum(dim=-1, keepdim=True)
    else:
        q, k = l2_normalize(q), l2_normalize(k)
    if cfg.model_type == "delta_net" and not cfg.use_beta:
        beta = torch.ones(T, HV, dtype=x.dtype)
    else:
        beta = torch.sigmoid(w.linear(x, p + "b_proj.weight"))
    if cfg.allow_neg_eigval:
        beta = 2.0 * beta
    rec("attn.beta", beta)
    log_decay = _log_decay(cfg, w, p, x)
    if log_decay is not None:
        rec("attn.log_decay", log_decay.reshape(T, -1))
    G = HV // H
    q = q.repeat_interleave(G, dim=1) * K ** -0.5
    k = k.repeat_interleave(G, dim=1)
    o, state["S"] = gated_delta_recurrent(q, k, v, beta, log_decay, state["S"])
    rec("attn.core", o.reshape(T, HV * V))
    rec("attn.state", state["S"])
    return w.linear(_output_norm(cfg, w, p, x, o).reshape(T, HV * V), p + "o_proj.weight")


# ---------------------------------------------------------------------------------------------------
# The model

def _attnres(cfg: FlaConfig, w: Weights, p: str, kind: str, blocks: list, partial, sublayer: int, rec) -> tuple:
    """fla's AttnRes step before sublayer 2i (layer i's attention, kind "attn_res") or 2i+1 (its MLP,
    "mlp_res"): the sources are blocks ++ [partial]; their Mix (recorded as kind + ".weights") is the
    sublayer's input, which the caller then RMS-normalizes with attn_norm / mlp_norm (fla folds that norm
    into fused_attnres). With no blocks yet (layer 0's attention) there is no mix: the input is the
    embedding itself. At a block boundary (sublayer % attnres_block_size == 0) the sources become the
    blocks and the partial restarts empty (None). Returns (input [T, D], blocks, partial)."""
    sources = blocks + [partial]
    if blocks:
        x, weights = attn_res_mix(sources, w[p + kind + "_norm.weight"], w[p + kind + "_proj.weight"],
                                  cfg.norm_eps)
        rec(kind + ".weights", weights)
    else:
        x = partial
    if sublayer % cfg.attnres_block_size == 0:
        return x, sources, None
    return x, blocks, partial


def fla_forward(cfg: FlaConfig, w: dict, tokens: torch.Tensor, record: Optional[dict] = None,
                cache: Optional[list] = None, bf16_inputs: frozenset = frozenset()) -> torch.Tensor:
    """tokens [T] int -> logits [T, vocab], in the dtype of w (from canonical_weights). cache (from
    initial_cache, or left by an earlier call) is the state the tokens continue from and is updated to
    the state after them; None starts from zeros. If record is a dict, every named intermediate is
    stored in it in forward order. A Linear whose weight is named in bf16_inputs (bf16_weight_names:
    the engine's bf16 dot products) rounds its input to bf16 first; all else stays in w's dtype."""
    rec = recorder(record)

    w = Weights(w, bf16_inputs)
    dtype = w["model.embeddings.weight"].dtype
    if cache is None:
        cache = initial_cache(cfg, dtype)
    mixer = linear_attention if cfg.model_type == "linear_attn" else delta_mixer
    eps = cfg.norm_eps
    attnres = cfg.attnres_block_size is not None
    x = rec("embed", w["model.embeddings.weight"][tokens])
    blocks = []  # AttnRes: the completed block sums, the embedding first; x is then the current partial sum
    for i in range(cfg.num_hidden_layers):
        p, n = f"model.layers.{i}.", f"h{i}."
        lrec = (lambda prefix: lambda name, t: rec(prefix + name, t))(n)
        h = x
        if attnres:
            h, blocks, x = _attnres(cfg, w, p, "attn_res", blocks, x, 2 * i, lrec)
        a = lrec("attn_norm", rms_norm(h, w[p + "attn_norm.weight"], eps))
        o = lrec("attn.out", mixer(cfg, w, p + "attn.", a, cache[i], lrec))
        x = lrec("resid_mid", o if x is None else x + o)
        h = x
        if attnres:
            h, blocks, x = _attnres(cfg, w, p, "mlp_res", blocks, x, 2 * i + 1, lrec)
        m = lrec("mlp_norm", rms_norm(h, w[p + "mlp_norm.weight"], eps))
        gate, up = w.linear(m, p + "mlp.gate_proj.weight"), w.linear(m, p + "mlp.up_proj.weight")
        mo = lrec("mlp.out", w.linear(silu(gate) * up, p + "mlp.down_proj.weight"))
        x = lrec("out", mo if x is None else x + mo)
    if attnres:
        x, weights = attn_res_mix(blocks + [x], w["model.res_norm.weight"], w["model.res_proj.weight"], eps)
        rec("output_res.weights", weights)
    y = rec("norm", rms_norm(x, w["model.norm.weight"], eps))
    head = "model.embeddings.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    return rec("logits", w.linear(y, head))


def intermediate_shapes(cfg: FlaConfig, T: int) -> list:
    """The names fla_forward records, in forward order, with their shapes: the golden-data contract."""
    D, H, HV, K, V = cfg.hidden_size, cfg.num_heads, cfg.v_heads, cfg.head_k_dim, cfg.head_v_dim
    B, blocks = cfg.attnres_block_size, 0
    out = [("embed", [T, D])]
    for i in range(cfg.num_hidden_layers):
        n = f"h{i}."
        if B is not None:
            if blocks:
                out.append((n + "attn_res.weights", [T, blocks + 1]))
            blocks += 2 * i % B == 0
        out += [(n + "attn_norm", [T, D]), (n + "attn.q", [T, H * K]), (n + "attn.k", [T, H * K]),
                (n + "attn.v", [T, HV * V])]
        if cfg.has_delta:
            out.append((n + "attn.beta", [T, HV]))
        if cfg.decay_kind == "head":
            out.append((n + "attn.log_decay", [T, HV]))
        elif cfg.decay_kind == "channel":
            out.append((n + "attn.log_decay", [T, HV * K]))
        out += [(n + "attn.core", [T, HV * V]), (n + "attn.state", [HV, K, V]), (n + "attn.out", [T, D]),
                (n + "resid_mid", [T, D])]
        if B is not None:
            out.append((n + "mlp_res.weights", [T, blocks + 1]))
            blocks += (2 * i + 1) % B == 0
        out += [(n + "mlp_norm", [T, D]), (n + "mlp.out", [T, D]), (n + "out", [T, D])]
    if B is not None:
        out.append(("output_res.weights", [T, blocks + 1]))
    return out + [("norm", [T, D]), ("logits", [T, cfg.vocab_size])]
