"""Kimi-Linear golden cases (family "kimi_linear"): each writes an HF model directory in the released format
(config.json with every field of the published Kimi-Linear-48B-A3B config at tiny sizes, model.safetensors
or shards with model.safetensors.index.json) with seeded random weights, and golden/ with the float64
intermediates of kimi_linear.py. Before writing, every case checks itself: the recorded names and shapes
are the contract; a float32 run agrees with float64 on every intermediate and picks the same experts;
every top-k expert and group selection has a margin (so float32 engines select the same experts); the
logits are causal; feeding the tokens in two parts (carrying the KDA states, conv tails and MLA latent
cache) reproduces the one-shot run; the absorbed MLA form reproduces the explicit one. The BF16 case also
gets the logits with the engine's bf16 dot products emulated (logits_bf16_dot.npy)."""

import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

import golden_io
from golden_io import (bf16_dot_golden, case_tokens, check_causal, check_contract, check_split, draw_params,
                       f32_errors, f32_manifest_entries, layers_summary, manifest_head, read_model_dir, relative_rms,
                       write_golden)
from kimi_linear import (ARCHITECTURE, MODEL_TYPE, KimiConfig, bf16_weight_names, canonical_weights,
                         initial_cache, intermediate_shapes, kimi_forward, tensor_specs)

# A float32 PyTorch run must agree with the float64 reference this well on every intermediate.
# OpenBLAS's kernel choice (OPENBLAS_CORETYPE=Haswell or the CPU's own) moves these float32 figures by up
# to 2x (measured: 1e-6 to 2.2e-6 here), so the bound sits well above both; a float32 path that
# went wrong is off by 1e-3 or more.
F32_SELF_CHECK_TOL = 1e-5
# Prefix logits, split feeds and the absorbed MLA form must match the one-shot explicit float64 run.
EXACT_TOL = 1e-12
ABSORBED_TOL = 1e-10
# Every top-k selection (experts, and groups) must win by this much in float64.
ROUTING_MARGIN = 1e-4
# Sum of the gathered weights before renormalization: keeps w / sum well conditioned.
MIN_RENORM_DENOMINATOR = 0.05
# tests/golden_test.cpp holds each intermediate to max(6 x f32_torch_rel_rms, 2e-7).
ENGINE_TOL_FACTOR, ENGINE_TOL_FLOOR = 6, 2e-7
# Every MoE layer must route to at least this share of its experts over the case's tokens.
MIN_EXPERTS_USED = 0.75

_TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16}
_HF_DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16"}
# Released checkpoints keep the KDA gate parameters in float32 whatever the weights dtype (spec 7.2);
# e_score_correction_bias is BF16 in Kimi-Linear and follows the weights dtype.
_ALWAYS_F32 = ("A_log", "dt_bias")

# The published Kimi-Linear-48B-A3B config.json (/work/shared/data/kimi-linear-48b-a3b/config.json) at
# test size: the same fields, tiny values. CASES override some of them.
BASE_CONFIG = {
    "architectures": [ARCHITECTURE],
    "auto_map": {
        "AutoConfig": "configuration_kimi.KimiLinearConfig",
        "AutoModel": "modeling_kimi.KimiLinearModel",
        "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM",
    },
    "bos_token_id": 250,
    "dtype": "float32",
    "eos_token_id": 252,
    "first_k_dense_replace": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "kv_lora_rank": 32,
    "linear_attn_config": {
        "full_attn_layers": [4],
        "head_dim": 16,
        "kda_layers": [1, 2, 3],
        "num_heads": 2,
        "short_conv_kernel_size": 4,
    },
    "mla_use_nope": True,
    "model_max_length": 1048576,
    "model_type": MODEL_TYPE,
    "moe_intermediate_size": 32,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "num_attention_heads": 4,
    "num_expert_group": 1,
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "num_shared_experts": 1,
    "pad_token_id": 255,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "routed_scaling_factor": 2.446,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "transformers_version": "4.57.0",
    "use_cache": True,
    "use_grouped_topk": True,
    "v_head_dim": 16,
    "vocab_size": 256,
}


@dataclass(frozen=True)
class KimiCase:
    name: str
    seed: int
    config: dict = field(default_factory=dict, hash=False)         # top-level config.json overrides
    linear_config: dict = field(default_factory=dict, hash=False)  # linear_attn_config overrides
    weights_dtype: str = "F32"
    shards: int = 1                    # > 1: model-0000k-of-0000N.safetensors + index
    T: int = 70                        # crosses the 16-, 32- and 64-token chunk boundaries
    bias_mean: float = 0.0             # e_score_correction_bias ~ N(bias_mean, bias_std)
    bias_std: float = 0.1
    checks: tuple = ()                 # extra assertions, see _extra_checks

    def json_config(self) -> dict:
        unknown = set(self.config) - set(BASE_CONFIG) - {"router_bias_in_weights", "activation_situ_beta",
                                                         "activation_situ_linear_beta"}
        unknown |= {f"linear_attn_config.{k}" for k in set(self.linear_config) - set(BASE_CONFIG["linear_attn_config"])}
        if unknown:
            raise ValueError(f"kimi_linear/{self.name}: not config fields: {sorted(unknown)}")
        d = json.loads(json.dumps(BASE_CONFIG))
        d.update(self.config)
        d["linear_attn_config"].update(self.linear_config)
        d["dtype"] = _HF_DTYPE_NAME[self.weights_dtype]
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        d["num_key_value_heads"] = d["num_attention_heads"]
        return d


CASES = [
    KimiCase("f32", 3013),
    KimiCase("bf16_sharded", 3006, weights_dtype="BF16", shards=3),
    # 16 experts in 4 groups, 2 groups kept, 4 experts a token; negative biases, so kept groups often
    # hold fewer than 4 experts with s' > 0 and the 0.0 mask lets a masked expert in. Dense and MoE
    # layers alternate (moe_layer_freq 2): layers 0, 1, 3 dense, 2 and 4 MoE; MLA at layers 2 and 4.
    KimiCase("grouped", 3015, config={"num_hidden_layers": 5, "num_experts": 16, "num_expert_group": 4,
                                      "topk_group": 2, "num_experts_per_token": 4, "moe_layer_freq": 2},
             linear_config={"kda_layers": [1, 2, 4], "full_attn_layers": [3, 5]},
             bias_mean=-0.4, bias_std=0.3, checks=("zero_mask_change",)),
    # The f32 case's weights with the released code's weights = s + b (router_bias_in_weights).
    KimiCase("bias_in_weights", 3013, config={"router_bias_in_weights": True}, checks=("bias_in_weights_matters",)),
    # The f32 case's weights with interleaved RoPE on the d_r slot (lineage extension).
    KimiCase("rope", 3013, config={"mla_use_nope": False, "rope_theta": 10000.0}, checks=("rope_matters",)),
    # No shared experts, one expert a token (no renormalization at k = 1).
    KimiCase("no_shared", 3007, config={"num_shared_experts": 0, "num_experts_per_token": 1}),
    # K3's SiTU-GLU in every MLP (dense, experts, shared) with betas small enough to cap the
    # activations this model makes; and with the up branch uncapped.
    KimiCase("situ", 3013, config={"hidden_act": "situ", "activation_situ_beta": 0.5,
                                   "activation_situ_linear_beta": 0.25}),
    KimiCase("situ_uncapped_up", 3013, config={"hidden_act": "situ", "activation_situ_beta": 0.5,
                                               "activation_situ_linear_beta": None}),
    # As many KDA heads as MLA heads (4), the shape llama.cpp's kimi-linear loads (it sizes both from one
    # head count): the GGUF comparisons run llama.cpp on this checkpoint's mirror (tests/gguf_llama_test.cpp).
    KimiCase("f32_heads_equal", 3014, linear_config={"num_heads": 4}),
]

# Linear weights [out, in] ~ N(0, gain / sqrt(in)), keyed by the name after "self_attn." /
# "block_sparse_moe." / "mlp." (experts by their w1/w2/w3). SiLU inputs, beta logits and router
# logits get std ~1.5-2, attention scores std ~2.
_MATRIX_GAIN = {
    # KDA
    "q_proj.weight": 1.5, "k_proj.weight": 1.5, "v_proj.weight": 1.5, "b_proj.weight": 2.0,
    "f_a_proj.weight": 1.0, "f_b_proj.weight": 1.5, "g_a_proj.weight": 1.0, "g_b_proj.weight": 1.5,
    "o_proj.weight": 1.0,
    # MLA (q_proj shared with KDA's gain); kv_a_proj_with_mqa: latent rows 0.5 (so kv_a_layernorm's eps
    # shows), rope rows 1.5
    "kv_b_proj.weight": 1.5,
    # FFNs
    "gate_proj.weight": 1.5, "up_proj.weight": 1.0, "down_proj.weight": 1.0,
    "w1.weight": 1.5, "w3.weight": 1.0, "w2.weight": 1.0, "gate.weight": 2.0,
    "lm_head.weight": 1.0,
}
_KV_A_GAINS = (0.5, 1.5)
_A_RANGE = (1.0, 16.0)         # A = exp(A_log) ~ U(1, 16) (the released init)
_DT_RANGE = (1e-3, 0.1)        # dt log-uniform, dt_bias = softplus^-1(dt) (fla's init)


def _matrix_key(name: str) -> str:
    if name == "lm_head.weight":
        return name
    tail = name.split(".self_attn.")[-1].split(".block_sparse_moe.")[-1].split(".mlp.")[-1]
    for prefix in ("shared_experts.", "experts."):
        if tail.startswith(prefix):
            tail = tail[len(prefix):].split(".", 1)[-1] if prefix == "experts." else tail[len(prefix):]
    return tail


def decay_init(kind: str, uniform: torch.Tensor) -> torch.Tensor:
    """kind "A_log": log of A ~ U(_A_RANGE); "dt_bias": softplus^-1(dt), dt log-uniform in _DT_RANGE; from
    uniform ~ U(0, 1) of the tensor's shape (also qwen_goldens')."""
    if kind == "A_log":
        lo, hi = _A_RANGE
        return torch.log(lo + (hi - lo) * uniform)
    lo, hi = math.log(_DT_RANGE[0]), math.log(_DT_RANGE[1])
    dt = torch.exp(lo + (hi - lo) * uniform.double())
    return (dt + torch.log(-torch.expm1(-dt))).float()


def init_value(name: str, shape: list, kind: str, noise: torch.Tensor, uniform: torch.Tensor, cfg: KimiConfig,
               bias: tuple, gains: dict = _MATRIX_GAIN, kv_a_gains: tuple = _KV_A_GAINS) -> torch.Tensor:
    """One float32 parameter of init_params's rules from its draws noise ~ N(0, 1) and uniform ~ U(0, 1)
    (both of the tensor's shape); bias = (mean, std) of e_score_correction_bias; gains and kv_a_gains as
    _MATRIX_GAIN and _KV_A_GAINS (another model passes its own)."""
    if kind == "embed":
        return noise
    if kind == "norm_weight":
        return 1.0 + 0.1 * noise
    if kind == "matrix" and name.endswith("kv_a_proj_with_mqa.weight"):
        row_gains = torch.full([shape[0], 1], kv_a_gains[0])
        row_gains[cfg.kv_lora_rank:] = kv_a_gains[1]
        return row_gains / math.sqrt(shape[-1]) * noise
    if kind == "matrix":
        return (gains[_matrix_key(name)] / math.sqrt(shape[-1])) * noise
    if kind == "conv":
        return noise / math.sqrt(shape[-1])
    if kind in ("A_log", "dt_bias"):
        return decay_init(kind, uniform)
    if kind == "router_bias":
        return bias[0] + bias[1] * noise
    raise AssertionError(f"init_params: no rule for {name} ({kind})")


def init_params(case: KimiCase, cfg: KimiConfig, gen: torch.Generator) -> dict:
    """float32 parameters by checkpoint name: embeddings N(0, 1), Linear weights as _MATRIX_GAIN says,
    conv taps N(0, 1/W), norm weights 1 + N(0, 0.1), A_log = log U(1, 16), dt_bias = softplus^-1 of a
    log-uniform dt in [1e-3, 0.1], e_score_correction_bias N(bias_mean, bias_std)."""
    return draw_params(tensor_specs(cfg), gen,
                       functools.partial(init_value, cfg=cfg, bias=(case.bias_mean, case.bias_std)))


def checkpoint_tensors(case: KimiCase, params: dict) -> dict:
    """Parameters rounded to the case's weights dtype, except A_log and dt_bias (always F32)."""
    dtype = _TORCH_DTYPE[case.weights_dtype]
    return {name: t if name.endswith(_ALWAYS_F32) else t.to(dtype) for name, t in params.items()}


def write_model_dir(case: KimiCase, case_dir: str, tensors: dict) -> None:
    """config.json (indent 4, sorted keys) and the checkpoint (also kimi_k3_goldens')."""
    golden_io.write_model_dir(case_dir, case.json_config(), tensors, case.shards, indent=4, sort_keys=True)


def check_routing(label: str, cfg: KimiConfig, routing: list) -> dict:
    """Raises unless every MoE layer's selections have the margins and well-conditioned weights, and use
    at least MIN_EXPERTS_USED of the experts. Returns the smallest margins and the 0.0-mask change count."""
    expert_margin = group_margin = math.inf
    changes = 0
    for layer, sel in routing:
        em, gm = float(sel.expert_margin.min()), float(sel.group_margin.min())
        if em <= ROUTING_MARGIN:
            t = int(sel.expert_margin.argmin())
            raise AssertionError(f"{label}: layer {layer} token {t}: the k-th and (k+1)-th biased expert scores "
                                 f"differ by {em:.3g} <= {ROUTING_MARGIN}")
        if gm <= ROUTING_MARGIN:
            t = int(sel.group_margin.argmin())
            raise AssertionError(f"{label}: layer {layer} token {t}: group scores differ by {gm:.3g} at the cut")
        if cfg.num_experts_per_token > 1 and cfg.moe_renormalize:
            den = float(sel.denominator.abs().min())
            if den < MIN_RENORM_DENOMINATOR:
                raise AssertionError(f"{label}: layer {layer}: renormalization denominator {den:.3g}")
        used = len(set(sel.ids.flatten().tolist()))
        if used < math.ceil(MIN_EXPERTS_USED * cfg.num_experts):
            raise AssertionError(f"{label}: layer {layer} routes to only {used} of {cfg.num_experts} experts")
        expert_margin, group_margin = min(expert_margin, em), min(group_margin, gm)
        changes += int(sel.zero_mask_changes.sum())
    return {"expert_margin": expert_margin, "group_margin": group_margin, "zero_mask_changes": changes}


@dataclass(frozen=True)
class ModelFunctions:
    """What self_check runs: kimi_linear.py's functions, or another model's with the same signatures
    (kimi_k3.py)."""
    family: str
    forward: Callable
    canonical_weights: Callable
    intermediate_shapes: Callable
    initial_cache: Callable
    f32_tol: float = F32_SELF_CHECK_TOL  # the float32 run's largest relative RMS on any intermediate


KIMI_LINEAR = ModelFunctions(MODEL_TYPE, kimi_forward, canonical_weights, intermediate_shapes, initial_cache)


def _extra_checks(case: KimiCase, cfg: KimiConfig, w64: dict, tokens: torch.Tensor, rec64: dict,
                  routing_stats: dict, errors: dict) -> str:
    label = f"kimi_linear/{case.name}"
    notes = []
    for check in case.checks:
        if check == "zero_mask_change":
            if routing_stats["zero_mask_changes"] < 1:
                raise AssertionError(f"{label}: the 0.0 group mask never selects differently from -inf")
            notes.append(f"0.0 mask changes {routing_stats['zero_mask_changes']} selections")
        elif check in ("bias_in_weights_matters", "rope_matters"):
            other = (dataclasses.replace(cfg, router_bias_in_weights=False) if check == "bias_in_weights_matters"
                     else dataclasses.replace(cfg, mla_use_nope=True))
            diff = relative_rms(kimi_forward(other, w64, tokens), rec64["logits"])
            if diff < 1e-3:
                raise AssertionError(f"{label}: logits move only {diff:.3g} without the option")
            notes.append(f"logits {diff:.2g} from the option off")
        else:
            raise AssertionError(f"{label}: unknown check {check}")
    return "".join(", " + n for n in notes)


def self_check(case, cfg: KimiConfig, tensors: dict, tokens: torch.Tensor, rec64: dict, routing64: list,
               model: ModelFunctions = KIMI_LINEAR, extra_checks: Callable = _extra_checks) -> tuple:
    """Raises unless the contract, the float32 agreement (same experts), the routing margins, causality, the
    split feed and the absorbed MLA form all hold, and then extra_checks(case, cfg, w64, tokens, rec64,
    routing_stats, f32_errors) (a note string, raising on failure). Returns ({name: {"f32_torch_rel_rms":
    err}}, notes). model: the forward and its helpers (kimi_linear.py's by default)."""
    label = f"{model.family}/{case.name}"
    kimi_forward, canonical_weights, initial_cache = model.forward, model.canonical_weights, model.initial_cache
    check_contract(label, rec64, model.intermediate_shapes(cfg, case.T))
    routing_stats = check_routing(label, cfg, routing64)

    rec32 = {}
    kimi_forward(cfg, canonical_weights(cfg, tensors, torch.float32), tokens, rec32)
    errors, worst = f32_errors(label, rec32, rec64, model.f32_tol)

    w64 = canonical_weights(cfg, tensors, torch.float64)
    half = case.T // 2
    check_causal(label, kimi_forward(cfg, w64, tokens[:half]), rec64["logits"], EXACT_TOL)

    cache = initial_cache(cfg, torch.float64)
    kimi_forward(cfg, w64, tokens[:half], cache=cache)
    second = kimi_forward(cfg, w64, tokens[half:], cache=cache)
    checks = [("logits of the second part", second, rec64["logits"][half:])]
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_kind(i) == "kda":
            checks.append((f"layer {i} KDA state", cache[i]["S"], rec64[f"h{i}.attn.state"]))
        else:
            checks += [(f"layer {i} MLA latent cache", cache[i]["latent"], rec64[f"h{i}.attn.latent"]),
                       (f"layer {i} MLA k_rope cache", cache[i]["k_rope"], rec64[f"h{i}.attn.k_rope"])]
    split_err = check_split(label, checks, half, case.T, EXACT_TOL)

    rec_abs = {}
    kimi_forward(cfg, w64, tokens, rec_abs, mla_form="absorbed")
    absorbed_err = max(relative_rms(rec_abs[name], rec64[name]) for name in rec64)
    if absorbed_err > ABSORBED_TOL:
        raise AssertionError(f"{label}: the absorbed MLA form differs from the explicit one "
                             f"(relative RMS {absorbed_err:.3g} > {ABSORBED_TOL})")

    # The latent must tell kv_a_layernorm's eps (1e-6) from rms_norm_eps by more than the engine's tolerance
    # (tests/golden_test.cpp: 6 x the f32 error, at least 2e-7).
    rec_eps = {}
    kimi_forward(dataclasses.replace(cfg, kv_a_norm_eps=cfg.rms_norm_eps), w64, tokens, rec_eps)
    eps_ratio = math.inf
    for name in rec64:
        if name.endswith("attn.latent"):
            moved = relative_rms(rec_eps[name], rec64[name])
            eps_ratio = min(eps_ratio, moved / max(ENGINE_TOL_FACTOR * errors[name], ENGINE_TOL_FLOOR))
    if eps_ratio < 2:
        raise AssertionError(f"{label}: kv_a_layernorm eps {cfg.rms_norm_eps} instead of {cfg.kv_a_norm_eps} moves "
                             f"attn.latent by only {eps_ratio:.2g} x the engine tolerance")

    notes = (f"f32 self-check {errors[worst]:.1e} ({worst}), split {split_err:.0e}, absorbed {absorbed_err:.0e}, "
             f"wrong kv_a eps {eps_ratio:.1f}x tol, "
             f"margins expert {routing_stats['expert_margin']:.1e} group {routing_stats['group_margin']:.1e}")
    notes += extra_checks(case, cfg, w64, tokens, rec64, routing_stats, errors)
    return f32_manifest_entries(errors), notes


def build_case(case: KimiCase, case_dir: str) -> str:
    """Writes case_dir (HF model directory) and case_dir/golden/. Returns a one-line summary."""
    cfg = KimiConfig.from_json(case.json_config())
    gen = torch.Generator().manual_seed(case.seed)
    write_model_dir(case, case_dir, checkpoint_tensors(case, init_params(case, cfg, gen)))
    config, tensors = read_model_dir(case_dir)
    cfg = KimiConfig.from_json(config)  # the reference runs on exactly what the C++ side will read
    tokens_np = case_tokens(case, cfg)
    tokens = torch.from_numpy(tokens_np).long()
    w64 = canonical_weights(cfg, tensors, torch.float64)
    rec64, routing64 = {}, []
    kimi_forward(cfg, w64, tokens, rec64, routing=routing64)
    per_name, notes = self_check(case, cfg, tensors, tokens, rec64, routing64)
    manifest = manifest_head(
        MODEL_TYPE, case, layer_types=[cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)],
        ffn_types=[cfg.ffn_kind(i) for i in range(cfg.num_hidden_layers)],
        state_layout="KDA attn.state is the final recurrent state S per head, [H, K, V]")
    golden_dir = os.path.join(case_dir, "golden")
    write_golden(golden_dir, tokens_np, rec64, manifest, per_name)
    # The router runs in float32 (its input is never rounded), as the reference code casts it.
    bf16 = frozenset(n for n in bf16_weight_names(tensors) if not n.endswith("block_sparse_moe.gate.weight"))
    if bf16:
        routing = []
        kimi_forward(cfg, w64, tokens, bf16_inputs=bf16, routing=routing)
        check_routing(f"kimi_linear/{case.name} (bf16 dot products)", cfg, routing)
    dot = bf16_dot_golden(golden_dir, f"kimi_linear/{case.name}", case.weights_dtype,
                          lambda t: kimi_forward(cfg, w64, t, bf16_inputs=bf16), tokens, rec64["logits"])
    files = f"{case.shards} shards" if case.shards > 1 else "1 file"
    return (f"{case.weights_dtype} layers {layers_summary(cfg, {'kda': 'K', 'mla': 'M'})} D={cfg.hidden_size} E={cfg.num_experts} "
            f"k={cfg.num_experts_per_token} T={case.T}; {len(tensors)} tensors in {files}, {len(rec64)} "
            f"intermediates, {notes}{dot}")
