"""Qwen3-Next and Qwen3.5 golden cases (families "qwen3_next", "qwen3_5", "qwen3_5_moe"): each writes an HF
model directory in the family's released format (config.json with the published field names at tiny sizes:
flat for Qwen3NextForCausalLM, top level + text_config + vision_config for Qwen3_5(Moe)ForConditionalGeneration;
model.safetensors or shards with model.safetensors.index.json) with seeded random weights, and golden/ with
the float64 intermediates of qwen.py. Every norm weight is random (the 1 + w norms N(0, 0.1), the gated
norm 1 + N(0, 0.1)), A_log and dt_bias nonzero, the rotary width below head_dim.

Before writing, every case checks itself: the recorded names and shapes are the contract; a float32 run
agrees with float64 on every intermediate and picks the same experts; every top-k selection wins by more
than ROUTING_MARGIN in probability, in float64 and under the bf16 dot-product emulation (the case's seed is
advanced until that holds; the seed used is in the manifest), and every MoE layer routes to at least 3/4
of its experts; the logits are causal; feeding the tokens in two parts (carrying S, the conv tails and the
KV cache) reproduces the one-shot run; and each misreading of the spec listed in the case (qwen.TRAPS: +1
norms read as plain, the qkvz interleave read as blocks, tiled GVA, ...) moves the logits by more than
TRAP_MIN_MOVE. BF16 cases also get logits_bf16_dot.npy."""

import json
import math
import os
from dataclasses import dataclass, field

import torch

from golden_io import (FamilyCases, bf16_dot_golden, case_tokens, check_causal, check_contract, check_split,
                       draw_params, f32_errors, f32_manifest_entries, layers_summary, manifest_head, read_model_dir,
                       relative_rms, write_golden, write_model_dir)
from kimi_linear_goldens import decay_init
from qwen import (ARCHITECTURES, FAMILIES as FAMILY_NAMES, FULL, LINEAR, SKIPPED_PREFIXES, TEXT_MODEL_TYPES,
                  QwenConfig, bf16_weight_names, canonical_weights, checkpoint_name, initial_cache,
                  intermediate_shapes, qwen_forward, tensor_specs, text_tensors)

# A float32 PyTorch run must agree with the float64 reference this well on every intermediate.
# OpenBLAS's kernel choice (OPENBLAS_CORETYPE=Haswell or the CPU's own) moves these float32 figures by up
# to 2x (measured: 1e-6 to 2.2e-6 here), so the bound sits well above both; a float32 path that
# went wrong is off by 1e-3 or more.
F32_SELF_CHECK_TOL = 1.5e-5
# Prefix logits and split feeds must match the one-shot float64 run.
EXACT_TOL = 1e-12
# Every top-k selection must win by this much in softmax probability (float64 and bf16-dot runs).
ROUTING_MARGIN = 1e-4
# Every MoE layer must route to at least this share of its experts over the case's tokens.
MIN_EXPERTS_USED = 0.75
# Seeds tried per case (case.seed, case.seed + 1, ...) until the routing margins hold and, for BF16 cases,
# the bf16 dot products select the same experts as the exact run (a flip moves the bf16-dot logits by
# ~0.2: 23 and 30 seeds are tried for the two BF16 MoE cases).
MAX_SEED_TRIES = 64
# Each misreading in case.traps must move the logits at least this much (relative RMS).
TRAP_MIN_MOVE = 1e-2

_TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16}
_HF_DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16"}
# Qwen3.5 ships these F32 in its bf16 checkpoints (spec 2.2); Qwen3-Next ships everything bf16 (spec 5.3).
_ALWAYS_F32 = {"qwen3_next": (), "qwen3_5": ("linear_attn.A_log", "linear_attn.norm.weight"),
               "qwen3_5_moe": ("linear_attn.A_log", "linear_attn.norm.weight")}
_ALL_TRAPS = ("plain_norm", "gated_norm_plus_one", "tiled_gva", "gate_blocks", "full_rotary", "interleaved_rope")

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json fields (spec 1.1) at test size.
NEXT_CONFIG = {
    "architectures": [ARCHITECTURES["qwen3_next"]],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 300,
    "decoder_sparse_step": 1,
    "eos_token_id": 302,
    "full_attention_interval": 4,
    "head_dim": 16,                  # not hidden_size / num_attention_heads (12)
    "hidden_act": "silu",
    "hidden_size": 48,
    "initializer_range": 0.02,
    "intermediate_size": 80,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 12,
    "max_position_embeddings": 4096,
    "mlp_only_layers": [],
    "model_type": "qwen3_next",
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 24,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.57.0.dev0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 320,
}

# The released Qwen3.5 text_config fields (spec 1.3; Qwen3.5-0.8B / -35B-A3B) at test size.
_QWEN35_TEXT_COMMON = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "dtype": "float32",
    "eos_token_id": 250,
    "full_attention_interval": 4,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "layer_types": [LINEAR, LINEAR, LINEAR, FULL],
    "linear_conv_kernel_dim": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "output_gate_type": "swish",
    "rms_norm_eps": 1e-06,
    "use_cache": True,
}
QWEN35_TEXT = {
    **_QWEN35_TEXT_COMMON,
    "head_dim": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "model_type": TEXT_MODEL_TYPES["qwen3_5"],
    "num_key_value_heads": 1,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                        "rope_theta": 10000000, "rope_type": "default"},
    "tie_word_embeddings": True,
    "vocab_size": 288,
}
QWEN35_MOE_TEXT = {
    **_QWEN35_TEXT_COMMON,
    "head_dim": 16,
    "hidden_size": 48,
    "linear_key_head_dim": 12,
    "linear_value_head_dim": 8,
    "model_type": TEXT_MODEL_TYPES["qwen3_5_moe"],
    "moe_intermediate_size": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
                        "rope_theta": 10000000, "rope_type": "default"},
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 24,
    "tie_word_embeddings": False,
    "vocab_size": 352,
}


def _qwen35_top(family: str, text: dict) -> dict:
    """A Qwen3_5(Moe)ForConditionalGeneration config.json around text (the published top-level fields)."""
    vocab, hidden = text["vocab_size"], text["hidden_size"]
    return {
        "architectures": [ARCHITECTURES[family]],
        "image_token_id": vocab - 6,
        "model_type": family,
        "text_config": text,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "transformers_version": "4.57.0.dev0",
        "video_token_id": vocab - 5,
        "vision_config": {
            "deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 64, "model_type": family,
            "num_heads": 2, "num_position_embeddings": 16, "out_hidden_size": hidden, "patch_size": 4,
            "spatial_merge_size": 2, "temporal_patch_size": 2},
        "vision_end_token_id": vocab - 3,
        "vision_start_token_id": vocab - 4,
    }


_BASE = {"qwen3_next": NEXT_CONFIG, "qwen3_5": QWEN35_TEXT, "qwen3_5_moe": QWEN35_MOE_TEXT}


@dataclass(frozen=True)
class QwenCase:
    family: str
    name: str
    seed: int
    text: dict = field(default_factory=dict, hash=False)   # text-config overrides (qwen3_next: the config)
    remove: tuple = ()                                      # text-config fields left out
    weights_dtype: str = "F32"
    shards: int = 1                    # > 1: model-0000k-of-0000N.safetensors + index
    T: int = 40
    extra_tensors: bool = False        # also write random mtp.* and model.visual.* tensors (never read)
    traps: tuple = _ALL_TRAPS          # misreadings that must move the logits (qwen.TRAPS)

    def json_config(self) -> dict:
        base = _BASE[self.family]
        unknown = set(self.text) - set(base) - {"rope_parameters", "dtype"}
        unknown |= set(self.remove) - set(base)
        if unknown:
            raise ValueError(f"{self.family}/{self.name}: not config fields: {sorted(unknown)}")
        text = json.loads(json.dumps(base))
        text.update(json.loads(json.dumps(self.text)))
        for k in self.remove:
            del text[k]
        dtype_key = "torch_dtype" if "torch_dtype" in text else "dtype"
        text[dtype_key] = _HF_DTYPE_NAME[self.weights_dtype]
        return text if self.family == "qwen3_next" else _qwen35_top(self.family, text)


_NEXT_TRAPS = _ALL_TRAPS + ("contiguous_qkvz",)

CASES = [
    # Qwen3-Next: r = 2, dk 8 != dv 12, untied, MoE on every layer (8 experts, top-2, shared expert),
    # RoPE top level (partial_rotary_factor 0.5: 8 of 16 dims), theta 1e4 so every rotary pair turns.
    QwenCase("qwen3_next", "f32_sharded", 3601, text={"rope_theta": 10000.0}, shards=2, traps=_NEXT_TRAPS),
    # The shape llama.cpp's qwen3next can load (its key and value heads one width, dk = dv = 12): the GGUF
    # comparisons run llama.cpp on this checkpoint's mirror (tests/gguf_llama_test.cpp).
    QwenCase("qwen3_next", "f32_dk_eq_dv", 3602,
             text={"rope_theta": 10000.0, "linear_key_head_dim": 12, "linear_value_head_dim": 12}, traps=_NEXT_TRAPS),
    # As saved by transformers v5 (rope_parameters, dtype), BF16 everywhere (A_log too: spec 5.3), layer 1
    # a dense MLP through mlp_only_layers, 3 shards.
    QwenCase("qwen3_next", "bf16_sharded", 3611,
             text={"mlp_only_layers": [1], "dtype": "bfloat16", "transformers_version": "5.0.0",
                   "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"}},
             remove=("rope_theta", "partial_rotary_factor", "rope_scaling", "torch_dtype"),
             weights_dtype="BF16", shards=3, traps=_NEXT_TRAPS + ("no_renorm",)),
    # Qwen3.5 dense: tied embeddings, layer_types written out, RoPE only in rope_parameters.
    QwenCase("qwen3_5", "f32", 3621),
    # BF16 with A_log and linear_attn.norm.weight F32 (as published); layer_types GDN, attn, GDN, attn.
    QwenCase("qwen3_5", "bf16", 3631, text={"layer_types": [LINEAR, FULL, LINEAR, FULL], "full_attention_interval": 2},
             weights_dtype="BF16"),
    # Qwen3.5 and Qwen3.5-MoE in the shape llama.cpp's qwen35 / qwen35moe load (dk = dv = 8): the GGUF
    # comparisons run llama.cpp on their mirrors (tests/gguf_llama_test.cpp).
    QwenCase("qwen3_5", "f32_dk_eq_dv", 3623, text={"linear_key_head_dim": 8, "linear_value_head_dim": 8}),
    # Qwen3.5 MoE: fused experts, untied, always-renormalizing router.
    QwenCase("qwen3_5_moe", "f32", 3641, traps=_ALL_TRAPS + ("no_renorm",)),
    QwenCase("qwen3_5_moe", "f32_dk_eq_dv", 3643, text={"linear_key_head_dim": 8, "linear_value_head_dim": 8},
             traps=_ALL_TRAPS + ("no_renorm",)),
    # BF16 (A_log, linear_attn.norm.weight F32) in 2 shards that also hold random mtp.* and model.visual.*
    # tensors, as released checkpoints do: the text model must skip them.
    QwenCase("qwen3_5_moe", "bf16_mtp_visual", 3651, weights_dtype="BF16", shards=2, extra_tensors=True),
    # The llama.cpp shape (dk = dv) at widths of whole 256-value blocks (hidden, heads × head dims, experts),
    # so that llama-quantize's K-quants apply to every matrix: tests/gguf_llama_test.cpp quantizes its mirror.
    QwenCase("qwen3_5_moe", "f32_width256", 3661,
             text={"hidden_size": 256, "head_dim": 64, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
                   "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
                   "rope_parameters": {"mrope_interleaved": True, "mrope_section": [8, 4, 4],
                                       "partial_rotary_factor": 0.5, "rope_theta": 10000000, "rope_type": "default"}},
             T=24),
]

# Linear weights [out, in] ~ N(0, gain / sqrt(in)), keyed by the module name before ".weight".
# SiLU inputs, beta logits and router logits get std ~1.5-2.
_MATRIX_GAIN = {
    "in_proj_qkvz": 1.5, "in_proj_ba": 2.0, "in_proj_qkv": 1.5, "in_proj_z": 1.5, "in_proj_b": 2.0,
    "in_proj_a": 1.5, "out_proj": 1.0, "q_proj": 1.5, "k_proj": 1.5, "v_proj": 1.0, "o_proj": 1.0,
    "gate": 2.0, "gate_proj": 1.5, "up_proj": 1.0, "down_proj": 1.0, "shared_expert_gate": 1.5, "lm_head": 1.0,
}
# A_log and dt_bias as Kimi Linear's (decay_init): A = exp(A_log) ~ U(1, 16) (TF's init draws U(0, 16)), dt
# log-uniform in [1e-3, 0.1], dt_bias = softplus^-1(dt).


def init_value(name: str, shape: list, kind: str, noise: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One float32 parameter from its draws noise ~ N(0, 1) and uniform ~ U(0, 1) of its shape."""
    if kind == "embed":
        return noise
    if kind == "norm1p":
        return 0.1 * noise              # stored w of (1 + w): the +1 must not be skipped
    if kind == "gated_norm":
        return 1.0 + 0.1 * noise        # used as is
    if kind == "matrix":
        return _MATRIX_GAIN[name.rsplit(".", 2)[-2]] / math.sqrt(shape[-1]) * noise
    if kind == "experts":               # gate_up_proj [E, 2I, D]: gate rows gain 1.5, up rows 1.0
        gains = torch.ones(shape[1], 1)
        if name.endswith("gate_up_proj"):
            gains[:shape[1] // 2] = 1.5
        return gains / math.sqrt(shape[-1]) * noise
    if kind == "conv":
        return noise / math.sqrt(shape[-1])
    if kind in ("A_log", "dt_bias"):
        return decay_init(kind, uniform)
    raise AssertionError(f"init_params: no rule for {name} ({kind})")


def init_params(cfg: QwenConfig, gen: torch.Generator) -> dict:
    """float32 text parameters by canonical name, in tensor_specs order."""
    return draw_params(tensor_specs(cfg), gen, init_value)


def extra_tensor_shapes(cfg: QwenConfig, config: dict) -> dict:
    """Stand-ins for the released checkpoints' MTP head (spec 2.1: mtp.fc [H, 2H], its norms and one
    full-attention + MoE decoder layer) and, for qwen3_5*, the vision tower (model.visual.*): name -> shape."""
    D, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    E, I, Is = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    shapes = {}
    if cfg.family != "qwen3_next":
        v = config["vision_config"]
        vh, vi, ps, tp = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
        merged = vh * v["spatial_merge_size"] ** 2
        p = "model.visual."
        shapes.update({p + "patch_embed.proj.weight": [vh, v["in_channels"], tp, ps, ps],
                       p + "patch_embed.proj.bias": [vh], p + "pos_embed.weight": [v["num_position_embeddings"], vh]})
        for b in range(v["depth"]):
            q = f"{p}blocks.{b}."
            shapes.update({q + "norm1.weight": [vh], q + "norm1.bias": [vh], q + "attn.qkv.weight": [3 * vh, vh],
                           q + "attn.qkv.bias": [3 * vh], q + "attn.proj.weight": [vh, vh], q + "attn.proj.bias": [vh],
                           q + "norm2.weight": [vh], q + "norm2.bias": [vh], q + "mlp.linear_fc1.weight": [vi, vh],
                           q + "mlp.linear_fc1.bias": [vi], q + "mlp.linear_fc2.weight": [vh, vi],
                           q + "mlp.linear_fc2.bias": [vh]})
        shapes.update({p + "merger.norm.weight": [vh], p + "merger.norm.bias": [vh],
                       p + "merger.linear_fc1.weight": [merged, merged], p + "merger.linear_fc1.bias": [merged],
                       p + "merger.linear_fc2.weight": [v["out_hidden_size"], merged],
                       p + "merger.linear_fc2.bias": [v["out_hidden_size"]]})
    shapes.update({"mtp.fc.weight": [D, 2 * D], "mtp.pre_fc_norm_embedding.weight": [D],
                   "mtp.pre_fc_norm_hidden.weight": [D], "mtp.norm.weight": [D]})
    p = "mtp.layers.0."
    shapes.update({p + "input_layernorm.weight": [D], p + "post_attention_layernorm.weight": [D],
                   p + "self_attn.q_proj.weight": [2 * nh * hd, D], p + "self_attn.k_proj.weight": [nkv * hd, D],
                   p + "self_attn.v_proj.weight": [nkv * hd, D], p + "self_attn.o_proj.weight": [D, nh * hd],
                   p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                   p + "mlp.gate.weight": [E, D], p + "mlp.shared_expert_gate.weight": [1, D],
                   p + "mlp.shared_expert.gate_proj.weight": [Is, D], p + "mlp.shared_expert.up_proj.weight": [Is, D],
                   p + "mlp.shared_expert.down_proj.weight": [D, Is]})
    if cfg.fused_experts:
        shapes.update({p + "mlp.experts.gate_up_proj": [E, 2 * I, D], p + "mlp.experts.down_proj": [E, D, I]})
    else:
        for e in range(E):
            shapes.update({f"{p}mlp.experts.{e}.gate_proj.weight": [I, D], f"{p}mlp.experts.{e}.up_proj.weight": [I, D],
                           f"{p}mlp.experts.{e}.down_proj.weight": [D, I]})
    return shapes


def checkpoint_tensors(case: QwenCase, cfg: QwenConfig, gen: torch.Generator) -> dict:
    """The checkpoint: text parameters under the family's names in the case's dtype (the family's _ALWAYS_F32
    tensors F32), then with extra_tensors the mtp.* / model.visual.* stand-ins (N(0, 0.02), weights dtype)."""
    dtype = _TORCH_DTYPE[case.weights_dtype]
    keep = _ALWAYS_F32[cfg.family]
    out = {checkpoint_name(cfg, name): t if name.endswith(keep) else t.to(dtype)
           for name, t in init_params(cfg, gen).items()}
    if case.extra_tensors:
        for name, shape in extra_tensor_shapes(cfg, case.json_config()).items():
            out[name] = (0.02 * torch.randn(shape, generator=gen, dtype=torch.float32)).to(dtype)
    return out


def routing_problem(cfg: QwenConfig, routing: list) -> str:
    """"" when every MoE layer's selections win by more than ROUTING_MARGIN and use at least
    MIN_EXPERTS_USED of the experts; else what fails."""
    for layer, sel in routing:
        margin = float(sel.margin.min())
        if margin <= ROUTING_MARGIN:
            return (f"layer {layer} token {int(sel.margin.argmin())}: the k-th and (k+1)-th expert probabilities "
                    f"differ by {margin:.3g} <= {ROUTING_MARGIN}")
        used = len(set(sel.ids.flatten().tolist()))
        if used < math.ceil(MIN_EXPERTS_USED * cfg.num_experts):
            return f"layer {layer} routes to only {used} of {cfg.num_experts} experts"
    return ""


def min_margin(routing: list) -> float:
    return min((float(sel.margin.min()) for _, sel in routing), default=math.inf)


def routing_problems(cfg: QwenConfig, tensors: dict, tokens: torch.Tensor, weights_dtype: str) -> list:
    """Why these weights do not route with margins: in float64, and with the bf16 dot products emulated
    where the weights are BF16 (which must also choose the same experts); empty when they do."""
    w64 = canonical_weights(cfg, tensors, torch.float64)
    runs = [("", frozenset())]
    if weights_dtype == "BF16":
        runs.append((" (bf16 dot products)", bf16_weight_names(cfg, tensors)))
    problems, selections = [], []
    for what, bf16 in runs:
        routing = []
        qwen_forward(cfg, w64, tokens, bf16_inputs=bf16, routing=routing)
        problems += [p + what for p in [routing_problem(cfg, routing)] if p]
        selections.append([sel.ids for _, sel in routing])
    if len(selections) == 2 and not all(map(torch.equal, *selections)):
        problems.append("the bf16 dot products select other experts")
    return problems


def choose_seed(case: QwenCase, cfg: QwenConfig, tokens: torch.Tensor) -> tuple:
    """(seed, checkpoint tensors): the first of case.seed, case.seed + 1, ... whose weights route with
    margins, in float64 and with the bf16 dot products emulated."""
    problem = ""
    for seed in range(case.seed, case.seed + MAX_SEED_TRIES):
        tensors = checkpoint_tensors(case, cfg, torch.Generator().manual_seed(seed))
        if not cfg.num_experts:
            return seed, tensors
        problems = routing_problems(cfg, tensors, tokens, case.weights_dtype)
        if not problems:
            return seed, tensors
        problem = problems[0]
    raise AssertionError(f"{case.family}/{case.name}: no seed in {case.seed}..{case.seed + MAX_SEED_TRIES - 1} "
                         f"routes with margins; last: {problem}")


def self_check(case: QwenCase, cfg: QwenConfig, tensors: dict, tokens: torch.Tensor, rec64: dict,
               routing64: list) -> tuple:
    """Raises unless the contract, float32 agreement (same experts), routing margins, causality, the split
    feed and the traps' effects hold. Returns ({name: {"f32_torch_rel_rms": err}}, notes)."""
    label = f"{case.family}/{case.name}"
    check_contract(label, rec64, intermediate_shapes(cfg, case.T))
    problem = routing_problem(cfg, routing64)
    if problem:
        raise AssertionError(f"{label}: {problem}")

    rec32 = {}
    qwen_forward(cfg, canonical_weights(cfg, tensors, torch.float32), tokens, rec32)
    errors, worst = f32_errors(label, rec32, rec64, F32_SELF_CHECK_TOL)

    w64 = canonical_weights(cfg, tensors, torch.float64)
    half = case.T // 2
    check_causal(label, qwen_forward(cfg, w64, tokens[:half]), rec64["logits"], EXACT_TOL)

    one_shot = initial_cache(cfg, torch.float64)
    qwen_forward(cfg, w64, tokens, cache=one_shot)
    split = initial_cache(cfg, torch.float64)
    qwen_forward(cfg, w64, tokens[:half], cache=split)
    second = qwen_forward(cfg, w64, tokens[half:], cache=split)
    checks = [("logits of the second part", second, rec64["logits"][half:])]
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_kind(i) == "gdn":
            checks += [(f"layer {i} GDN state", split[i]["S"], rec64[f"h{i}.attn.state"]),
                       (f"layer {i} conv tail", split[i]["conv"], one_shot[i]["conv"])]
        else:
            checks += [(f"layer {i} key cache", split[i]["k"], one_shot[i]["k"]),
                       (f"layer {i} value cache", split[i]["v"], one_shot[i]["v"])]
    split_err = check_split(label, checks, half, case.T, EXACT_TOL)

    moves = {}
    for trap in case.traps:
        moves[trap] = relative_rms(qwen_forward(cfg, w64, tokens, traps=frozenset([trap])), rec64["logits"])
        if moves[trap] < TRAP_MIN_MOVE:
            raise AssertionError(f"{label}: misreading '{trap}' moves the logits by only {moves[trap]:.3g}")
    weakest = min(moves, key=moves.get)

    notes = (f"f32 self-check {errors[worst]:.1e} ({worst}), split {split_err:.0e}, "
             f"weakest trap {weakest} {moves[weakest]:.2g}")
    if routing64:
        notes += f", routing margin {min_margin(routing64):.1e}"
    return f32_manifest_entries(errors), notes


def build_case(case: QwenCase, case_dir: str) -> str:
    """Writes case_dir (HF model directory) and case_dir/golden/. Returns a one-line summary."""
    label = f"{case.family}/{case.name}"
    cfg = QwenConfig.from_json(case.json_config())
    tokens_np = case_tokens(case, cfg)
    tokens = torch.from_numpy(tokens_np).long()
    seed, tensors = choose_seed(case, cfg, tokens)
    write_model_dir(case_dir, case.json_config(), tensors, case.shards, sort_keys=True)
    config, tensors = read_model_dir(case_dir)
    cfg = QwenConfig.from_json(config)  # the reference runs on exactly what the C++ side will read
    skipped = sorted(n for n in tensors if n.startswith(SKIPPED_PREFIXES[cfg.family]))
    if case.extra_tensors != bool(skipped):
        raise AssertionError(f"{label}: {len(skipped)} mtp/visual tensors in the checkpoint")
    w64 = canonical_weights(cfg, tensors, torch.float64)
    rec64, routing64 = {}, []
    qwen_forward(cfg, w64, tokens, rec64, routing=routing64)
    per_name, notes = self_check(case, cfg, tensors, tokens, rec64, routing64)
    f32_names = sorted(checkpoint_name(cfg, n) for n, t in text_tensors(cfg, tensors).items()
                       if t.dtype == torch.float32) if case.weights_dtype == "BF16" else []
    manifest = manifest_head(
        case.family, case, seed=seed, tensor_prefix=cfg.prefix, skipped_tensors=len(skipped),
        f32_tensors_in_bf16_checkpoint=f32_names, rotary_dim=cfg.rotary_dim,
        layer_types=[cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)],
        ffn_types=[cfg.ffn_kind(i) for i in range(cfg.num_hidden_layers)],
        state_layout="GDN attn.state is the final recurrent state S per value head, [Hv, dk, dv]")
    golden_dir = os.path.join(case_dir, "golden")
    write_golden(golden_dir, tokens_np, rec64, manifest, per_name)
    bf16 = bf16_weight_names(cfg, tensors)
    dot = bf16_dot_golden(golden_dir, label, case.weights_dtype,
                          lambda t: qwen_forward(cfg, w64, t, bf16_inputs=bf16), tokens, rec64["logits"])
    files = f"{case.shards} shards" if case.shards > 1 else "1 file"
    return (f"{case.weights_dtype} layers {layers_summary(cfg, {'gdn': 'G', 'attention': 'A'})} D={cfg.hidden_size} E={cfg.num_experts} "
            f"k={cfg.num_experts_per_tok} T={case.T} seed={seed}; {len(tensors)} tensors ({len(skipped)} skipped) in "
            f"{files}, {len(rec64)} intermediates, {notes}{dot}")


# One make_goldens.py family per model type: DIR/<model_type>/<case>/.
FAMILIES = [(f, FamilyCases([c for c in CASES if c.family == f], build_case)) for f in FAMILY_NAMES]
