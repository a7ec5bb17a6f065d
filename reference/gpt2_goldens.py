"""GPT-2 golden cases: each writes an HF model directory (config.json + safetensors) with seeded random
weights, and golden/ with the float64 reference intermediates of gpt2.py, after checking that a float32
run agrees and that the model is causal; BF16 cases also get the logits with the engine's bf16 dot
products emulated (logits_bf16_dot.npy)."""

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

import golden_io
from golden_io import (bf16_dot_golden, case_tokens, check_causal, check_contract, f32_errors, f32_manifest_entries,
                       manifest_head, read_model_dir, write_golden)
from gpt2 import (GPT2Config, bf16_weight_names, canonical_weights, gpt2_forward, intermediate_shapes,
                  tensor_specs)

# A float32 PyTorch run must agree with the float64 reference this well on every intermediate;
# the C++ tests hold float32 weights to 1e-5, so the reference itself must sit well inside that.
# OpenBLAS's kernel choice (OPENBLAS_CORETYPE=Haswell or the CPU's own) moves these float32 figures by up
# to 2x (measured: 1e-6 to 2.2e-6 here), so the bound sits well above both; a float32 path that
# went wrong is off by 1e-3 or more.
F32_SELF_CHECK_TOL = 5e-6
# Rows 0..T/2-1 of the float64 logits must not depend on later tokens.
CAUSAL_TOL = 1e-12

_TORCH_DTYPE = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_HF_DTYPE_NAME = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass(frozen=True)
class GPT2Case:
    name: str
    config: GPT2Config
    T: int
    seed: int
    weights_dtype: str             # "F32", "F16" or "BF16"
    prefix: str = ""               # "" (openai-community/gpt2) or "transformer." (distilgpt2 style)
    mask_buffer: Optional[str] = None  # dtype of h.{i}.attn.bias buffers: None, "F32" or "BOOL"
    masked_bias: bool = False      # also write h.{i}.attn.masked_bias, F32 scalar -1e4 (old exports)
    lm_head: bool = False          # write an explicit lm_head.weight equal to wte
    n_shards: int = 1
    # The fields config.json holds, or None for all of them (as save_pretrained writes it). The others
    # take HF GPT2Config's published defaults, which GPT2Config's own defaults are.
    config_fields: Optional[tuple] = None


CASES = [
    GPT2Case("f32_tanh", GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                    activation_function="gelu_new"),
             T=37, seed=1001, weights_dtype="F32", mask_buffer="F32"),
    GPT2Case("bf16_prefix_exact", GPT2Config(vocab_size=263, n_positions=48, n_embd=48, n_layer=2, n_head=2,
                                             n_inner=96, activation_function="gelu"),
             T=40, seed=1002, weights_dtype="BF16", prefix="transformer.", mask_buffer="BOOL",
             masked_bias=True, lm_head=True),
    GPT2Case("f16_sharded", GPT2Config(vocab_size=257, n_positions=32, n_embd=32, n_layer=3, n_head=2,
                                       activation_function="gelu_new", layer_norm_epsilon=1e-6),
             T=32, seed=1003, weights_dtype="F16", n_shards=2),
    GPT2Case("f32_gpt2_shapes", GPT2Config(vocab_size=1000, n_positions=128, n_embd=96, n_layer=1, n_head=12,
                                           activation_function="gelu_new"),
             T=128, seed=1004, weights_dtype="F32"),
    # config.json with the size fields only: n_inner, activation_function, layer_norm_epsilon,
    # scale_attn_weights and tie_word_embeddings take HF's defaults (4 * n_embd, gelu_new, 1e-5, true, true).
    GPT2Case("f32_defaults", GPT2Config(vocab_size=211, n_positions=40, n_embd=48, n_layer=2, n_head=3),
             T=40, seed=1005, weights_dtype="F32",
             config_fields=("model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head")),
    # GPT-2's own head size (n_embd / n_head = 64).
    GPT2Case("f32_head64", GPT2Config(vocab_size=300, n_positions=64, n_embd=128, n_layer=2, n_head=2),
             T=50, seed=1006, weights_dtype="F32"),
    # A separate lm_head.weight, drawn independently of wte (tie_word_embeddings false).
    # lineage's extension for the study: q | k | v plus a causal short convolution over them.
    GPT2Case("f32_conv", GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4, conv_size=4),
             T=37, seed=1008, weights_dtype="F32"),
    GPT2Case("f32_untied_lm_head", GPT2Config(vocab_size=280, n_positions=48, n_embd=64, n_layer=2, n_head=4,
                                              tie_word_embeddings=False),
             T=40, seed=1007, weights_dtype="F32"),
    # Widths of whole 256-value blocks, so that llama-quantize's K-quants apply to every matrix (the GGUF
    # block-format comparisons quantize this checkpoint's mirror: tests/gguf_llama_test.cpp).
    GPT2Case("f32_width256", GPT2Config(vocab_size=512, n_positions=64, n_embd=256, n_layer=2, n_head=4),
             T=40, seed=1009, weights_dtype="F32"),
]


# Conv1D weights [in, out] ~ N(0, gain / sqrt(in)). GPT-2's own N(0, 0.02) leaves these small models in
# the linear regime of softmax and GELU (gelu vs gelu_new moved the logits by only 2e-6..1e-5 relative
# RMS, under the C++ tolerance); these gains give attention scores and GELU inputs of std ~2.
_MATRIX_GAIN = {"attn.c_attn.weight": 1.5, "attn.c_proj.weight": 1.0,
                "mlp.c_fc.weight": 2.0, "mlp.c_proj.weight": 1.0}


def init_params(cfg: GPT2Config, gen: torch.Generator) -> dict:
    """float32 parameters by canonical name: wte ~ N(0, 0.02), wpe ~ N(0, 0.1), Conv1D weights as
    _MATRIX_GAIN says, LayerNorm weights 1 + N(0, 0.1), all biases N(0, 0.02) (so none is a no-op), and an
    untied lm_head N(0, 1 / n_embd) (logits of std ~1, far from the tied head's), and the study's short
    convolution N(0, 0.3) (a tenth or more of q | k | v, so a wrong tap shows)."""
    out = {}
    for name, shape, kind in tensor_specs(cfg):
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "norm_weight":
            out[name] = 1.0 + 0.1 * noise
        elif kind == "matrix":
            gain = _MATRIX_GAIN[name.split(".", 2)[2]]
            out[name] = (gain / math.sqrt(shape[0])) * noise
        elif kind == "lm_head":
            out[name] = noise / math.sqrt(shape[1])
        elif kind == "conv":
            out[name] = 0.3 * noise
        elif name == "wpe.weight":
            out[name] = 0.1 * noise
        else:
            out[name] = 0.02 * noise
    return out


def checkpoint_tensors(case: GPT2Case, params: dict) -> dict:
    """Parameters rounded to the case's dtype, named as the checkpoint names them, with the buffers
    (after each layer's ln_1, where HF's state_dict puts them) and lm_head the case asks for."""
    cfg, dtype = case.config, _TORCH_DTYPE[case.weights_dtype]
    n = cfg.n_positions
    out = {}
    for name, t in params.items():
        out[("" if name == "lm_head.weight" else case.prefix) + name] = t.to(dtype)
        layer_ln_1 = name.startswith("h.") and name.endswith(".ln_1.bias")
        if layer_ln_1 and case.mask_buffer is not None:
            attn = case.prefix + name[: -len("ln_1.bias")] + "attn."
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
            out[attn + "bias"] = mask if case.mask_buffer == "BOOL" else mask.to(torch.float32)
            if case.masked_bias:
                out[attn + "masked_bias"] = torch.tensor(-1e4, dtype=torch.float32)
    if case.lm_head:
        out["lm_head.weight"] = params["wte.weight"].to(dtype)
    return out


def hf_config(case: GPT2Case) -> dict:
    """config.json as transformers' GPT2Config.save_pretrained would write it (the fields that matter),
    or only case.config_fields of it."""
    c = case.config
    full = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.n_positions,
        "n_ctx": c.n_positions,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": c.n_inner,
        "activation_function": c.activation_function,
        "layer_norm_epsilon": c.layer_norm_epsilon,
        "scale_attn_weights": c.scale_attn_weights,
        "attn_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "resid_pdrop": 0.1,
        "initializer_range": 0.02,
        "bos_token_id": c.vocab_size - 1,
        "eos_token_id": c.vocab_size - 1,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": _HF_DTYPE_NAME[case.weights_dtype],
    }
    if c.conv_size:
        full["conv_size"] = c.conv_size
    if case.config_fields is None:
        return full
    return {key: full[key] for key in case.config_fields}


def write_model_dir(case: GPT2Case, case_dir: str, tensors: dict) -> None:
    """config.json (hf_config, indent 2) and the checkpoint (case.n_shards files)."""
    golden_io.write_model_dir(case_dir, hf_config(case), tensors, case.n_shards)


def self_check(case: GPT2Case, tensors: dict, tokens: torch.Tensor, rec64: dict) -> dict:
    """Raises unless float32 agrees with float64 on every intermediate and the logits are causal.
    Returns {name: {"f32_torch_rel_rms": err}} for the manifest."""
    cfg, label = case.config, f"gpt2/{case.name}"
    check_contract(label, rec64, intermediate_shapes(cfg, case.T))
    rec32 = {}
    gpt2_forward(cfg, canonical_weights(cfg, tensors, torch.float32), tokens, rec32)
    errors, _ = f32_errors(label, rec32, rec64, F32_SELF_CHECK_TOL)
    w64 = canonical_weights(cfg, tensors, torch.float64)
    check_causal(label, gpt2_forward(cfg, w64, tokens[:case.T // 2]), rec64["logits"], CAUSAL_TOL)
    return f32_manifest_entries(errors)


def build_case(case: GPT2Case, case_dir: str) -> str:
    """Writes case_dir (HF model directory) and case_dir/golden/. Returns a one-line summary."""
    cfg = case.config
    gen = torch.Generator().manual_seed(case.seed)
    write_model_dir(case, case_dir, checkpoint_tensors(case, init_params(cfg, gen)))
    config, tensors = read_model_dir(case_dir)  # the reference runs on exactly what the C++ side will read
    written = GPT2Config.from_json(config)  # absent fields take GPT2Config's (HF's) defaults
    if written != cfg:
        raise AssertionError(f"gpt2/{case.name}: config.json reads back as {written}, expected {cfg}")
    tokens_np = case_tokens(case, cfg)
    tokens = torch.from_numpy(tokens_np).long()
    rec64 = {}
    gpt2_forward(cfg, canonical_weights(cfg, tensors, torch.float64), tokens, rec64)
    per_name = self_check(case, tensors, tokens, rec64)
    manifest = manifest_head("gpt2", case)
    golden_dir = os.path.join(case_dir, "golden")
    write_golden(golden_dir, tokens_np, rec64, manifest, per_name)
    worst = max(v["f32_torch_rel_rms"] for v in per_name.values())
    w64, bf16 = canonical_weights(cfg, tensors, torch.float64), bf16_weight_names(tensors)
    dot = bf16_dot_golden(golden_dir, f"gpt2/{case.name}", case.weights_dtype,
                          lambda t: gpt2_forward(cfg, w64, t, bf16_inputs=bf16), tokens, rec64["logits"])
    return (f"{case.weights_dtype} L={cfg.n_layer} H={cfg.n_head} D={cfg.n_embd} F={cfg.mlp_width} "
            f"V={cfg.vocab_size} T={case.T} {cfg.activation_function}, {len(tensors)} tensors in "
            f"{case.n_shards} file(s), {len(rec64)} intermediates, f32 self-check {worst:.1e}{dot}")
