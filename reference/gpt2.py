"""GPT-2 prefill forward in plain PyTorch, written from docs spec section 1 (attention-mla-moe-attnres.md),
matching Hugging Face GPT2LMHeadModel at inference. The golden reference for the C++ GPT-2 path:
it computes in the dtype of the weights it is given (float64 for goldens) and records every named
intermediate, so a test can report the first one that diverges. With bf16_inputs it also emulates the
engine's bf16 dot products (the input of each linear on a BF16 weight rounded to bf16)."""

import math
import re
from dataclasses import dataclass
from typing import Optional

import torch

from golden_io import recorder


@dataclass(frozen=True)
class GPT2Config:
    """The GPT2Config fields the forward depends on, with HF's names and HF's published defaults (spec 1.1):
    a config.json field left out takes these values."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: Optional[int] = None  # null -> 4 * n_embd
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    tie_word_embeddings: bool = True  # false: the checkpoint holds its own lm_head.weight
    # Not GPT-2's: lineage's study extension. > 0: q | k | v += a causal depthwise convolution of
    # conv_size taps over them (h.{i}.attn.c_attn_conv1d.weight [3D, 1, conv_size], no bias, no activation).
    conv_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_width(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def from_json(cls, d: dict) -> "GPT2Config":
        return cls(**{f: d[f] for f in cls.__dataclass_fields__ if f in d})


def tensor_specs(cfg: GPT2Config) -> list:
    """Every parameter of a GPT-2 model once, in module order: (name without prefix, shape, kind).
    kind is "embed", "matrix", "norm_weight", "bias", "conv" or "lm_head" (untied only, [vocab, D] as nn.Linear
    stores it); Conv1D weights are [in, out]."""
    D, F = cfg.n_embd, cfg.mlp_width
    specs = [("wte.weight", [cfg.vocab_size, D], "embed"), ("wpe.weight", [cfg.n_positions, D], "embed")]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        specs += [
            (p + "ln_1.weight", [D], "norm_weight"), (p + "ln_1.bias", [D], "bias"),
            (p + "attn.c_attn.weight", [D, 3 * D], "matrix"), (p + "attn.c_attn.bias", [3 * D], "bias"),
        ]
        if cfg.conv_size:
            specs.append((p + "attn.c_attn_conv1d.weight", [3 * D, 1, cfg.conv_size], "conv"))
        specs += [
            (p + "attn.c_proj.weight", [D, D], "matrix"), (p + "attn.c_proj.bias", [D], "bias"),
            (p + "ln_2.weight", [D], "norm_weight"), (p + "ln_2.bias", [D], "bias"),
            (p + "mlp.c_fc.weight", [D, F], "matrix"), (p + "mlp.c_fc.bias", [F], "bias"),
            (p + "mlp.c_proj.weight", [F, D], "matrix"), (p + "mlp.c_proj.bias", [D], "bias"),
        ]
    specs += [("ln_f.weight", [D], "norm_weight"), ("ln_f.bias", [D], "bias")]
    if not cfg.tie_word_embeddings:
        specs.append(("lm_head.weight", [cfg.vocab_size, D], "lm_head"))
    return specs


_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


def _bare(name: str) -> str:
    return name[len("transformer."):] if name.startswith("transformer.") else name


def bf16_weight_names(tensors: dict) -> frozenset:
    """Names (without 'transformer.') of the checkpoint tensors stored in BF16: the bf16_inputs of
    gpt2_forward that emulate the engine's bf16 dot products."""
    return frozenset(_bare(name) for name, t in tensors.items() if t.dtype == torch.bfloat16)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bf16 (ties to even), back in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def canonical_weights(cfg: GPT2Config, tensors: dict, dtype: torch.dtype) -> dict:
    """Checkpoint tensors -> {name without 'transformer.': tensor in dtype}, causal-mask buffers dropped,
    'lm_head.weight' kept if present (an untied model must have it). Raises on missing, unexpected or
    misshapen tensors."""
    out = {}
    for name, t in tensors.items():
        bare = _bare(name)
        if not _BUFFER.match(bare):
            out[bare] = t.to(dtype)
    expected = {name: shape for name, shape, _ in tensor_specs(cfg)}
    if "lm_head.weight" in out:
        expected["lm_head.weight"] = [cfg.vocab_size, cfg.n_embd]
    if set(out) != set(expected):
        raise ValueError(f"gpt2: missing {sorted(set(expected) - set(out))}, "
                         f"unexpected {sorted(set(out) - set(expected))}")
    for name, shape in expected.items():
        if list(out[name].shape) != shape:
            raise ValueError(f"gpt2: '{name}' has shape {list(out[name].shape)}, expected {shape}")
    return out


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """[T, D] -> [T, D]: (x - mean) / sqrt(biased var + eps) * weight + bias, over the last axis."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def gelu_new(u: torch.Tensor) -> torch.Tensor:
    """HF 'gelu_new' (GPT-2's tanh approximation)."""
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def gelu_exact(u: torch.Tensor) -> torch.Tensor:
    """HF 'gelu' (exact, erf form)."""
    return 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))


ACTIVATIONS = {"gelu_new": gelu_new, "gelu": gelu_exact}


def causal_attention(qkv: torch.Tensor, n_head: int, scale: float) -> torch.Tensor:
    """qkv [T, 3D] (columns q | k | v, head h at columns h*hd..h*hd+hd-1 of each) -> context [T, D]:
    per head softmax(q kᵀ * scale, keys j <= query t) · v, heads concatenated in head order."""
    T, D3 = qkv.shape
    D = D3 // 3
    hd = D // n_head
    q, k, v = (qkv[:, c * D:(c + 1) * D].reshape(T, n_head, hd).transpose(0, 1) for c in range(3))
    scores = (q @ k.transpose(1, 2)) * scale  # [H, T, T]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ v).transpose(0, 1).reshape(T, D)


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, C], weight [C, 1, W] -> y [T, C], y[t, c] = sum_j weight[c, 0, j] x[t - W + 1 + j, c] (zeros
    before t = 0)."""
    T, W = x.shape[0], weight.shape[2]
    padded = torch.cat([torch.zeros(W - 1, x.shape[1], dtype=x.dtype), x])
    return sum(weight[:, 0, j] * padded[j:j + T] for j in range(W))


def gpt2_forward(cfg: GPT2Config, w: dict, tokens: torch.Tensor, record: Optional[dict] = None,
                 bf16_inputs: frozenset = frozenset()):
    """tokens [T] int at positions 0..T-1 -> logits [T, V], in the dtype of w (from canonical_weights).
    If record is a dict, every named intermediate is stored in it in forward order. A linear whose
    weight is named in bf16_inputs (bf16_weight_names: the engine's bf16 dot products) rounds its input
    to bf16 first; its products and sums stay in w's dtype."""
    rec = recorder(record)

    def linear(x, name, transposed=False):
        """x [T, in] @ W, W = w[name] [in, out] (Conv1D), or its transpose if stored [out, in]."""
        weight = w[name].T if transposed else w[name]
        return (round_bf16(x) if name in bf16_inputs else x) @ weight

    T = tokens.shape[0]
    if T > cfg.n_positions:
        raise ValueError(f"gpt2: {T} tokens exceed n_positions {cfg.n_positions}")
    act = ACTIVATIONS[cfg.activation_function]
    eps = cfg.layer_norm_epsilon
    scale = 1.0 / math.sqrt(cfg.head_dim) if cfg.scale_attn_weights else 1.0
    x = rec("embed", w["wte.weight"][tokens] + w["wpe.weight"][:T])
    for i in range(cfg.n_layer):
        p, n = f"h.{i}.", f"h{i}."
        a = rec(n + "ln_1", layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps))
        qkv = linear(a, p + "attn.c_attn.weight") + w[p + "attn.c_attn.bias"]
        if cfg.conv_size:
            qkv = qkv + causal_depthwise_conv(qkv, w[p + "attn.c_attn_conv1d.weight"])
        qkv = rec(n + "attn.qkv", qkv)
        ctx = rec(n + "attn.context", causal_attention(qkv, cfg.n_head, scale))
        o = rec(n + "attn.out", linear(ctx, p + "attn.c_proj.weight") + w[p + "attn.c_proj.bias"])
        x = rec(n + "resid_mid", x + o)
        m = rec(n + "ln_2", layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps))
        u = rec(n + "mlp.act", act(linear(m, p + "mlp.c_fc.weight") + w[p + "mlp.c_fc.bias"]))
        mo = rec(n + "mlp.out", linear(u, p + "mlp.c_proj.weight") + w[p + "mlp.c_proj.bias"])
        x = rec(n + "out", x + mo)
    y = rec("ln_f", layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps))
    head = "lm_head.weight" if "lm_head.weight" in w else "wte.weight"
    return rec("logits", linear(y, head, transposed=True))


def intermediate_shapes(cfg: GPT2Config, T: int) -> list:
    """The names gpt2_forward records, in forward order, with their shapes: the golden-data contract."""
    D, F = cfg.n_embd, cfg.mlp_width
    out = [("embed", [T, D])]
    for i in range(cfg.n_layer):
        n = f"h{i}."
        out += [(n + "ln_1", [T, D]), (n + "attn.qkv", [T, 3 * D]), (n + "attn.context", [T, D]),
                (n + "attn.out", [T, D]), (n + "resid_mid", [T, D]), (n + "ln_2", [T, D]),
                (n + "mlp.act", [T, F]), (n + "mlp.out", [T, D]), (n + "out", [T, D])]
    return out + [("ln_f", [T, D]), ("logits", [T, cfg.vocab_size])]
