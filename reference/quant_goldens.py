"""Quantized-checkpoint golden cases (family "quant"): each writes a tiny Qwen3-Next model (model_type
"qwen3_next", qwen.py's forward and config) as a quantized HF directory -- config.json with a
quantization_config, model.safetensors holding the targeted Linear weights as compressed_tensors.quantize
wrote them -- and golden/ with the float64 forward of qwen.py on the DEQUANTIZED weights
(compressed_tensors.dequantize: each weight's defined value, code times scale once in float32). Every
intermediate of qwen_forward is written, as the qwen3_next goldens do.

Model (every case): D 64, vocab 256, T 32; layers GGGA (Gated DeltaNet x3, gated attention), MoE everywhere
(8 experts of width 32, top-2, shared expert of width 192 with its sigmoid gate). Hk 2 / Hv 4 key / value
heads of 16; attention 4 heads / 2 kv heads of 32 (rotary 8). Linear shapes [out, in]:
  linear_attn.in_proj_qkvz [192, 64], in_proj_ba [8, 64], out_proj [64, 64]
  self_attn.q_proj [256, 64], k_proj / v_proj [64, 64], o_proj [64, 128]
  mlp.experts.{e}.gate_proj / up_proj [32, 64], down_proj [64, 32]
  mlp.shared_expert.gate_proj / up_proj [192, 64], down_proj [64, 192]
  unquantized: mlp.gate [8, 64], mlp.shared_expert_gate [1, 64], lm_head [256, 64], embed_tokens, norms, conv1d,
  A_log, dt_bias
Every in-dim is a multiple of 32 (MXFP4, group 32); o_proj reads 128 (W8A16 group 128); out-dims 192, 8, 32, 64
are not multiples of 128 and shared_expert.down_proj reads 192, so FP8 [128, 128] blocks are partial in both
dims (down_proj's scale is [1, 2], in_proj_qkvz's and the shared gate / up's [2, 1]).
The ignore list is llm-compressor's Qwen3-Next recipe: lm_head, re:.*mlp.gate$, re:.*mlp.shared_expert_gate$;
"Linear" targets the model's Linear modules (qwen.tensor_specs' matrices), not embed_tokens.

Before writing, every case checks itself: the checkpoint read back has exactly the quantized tensors written,
and its quantization_config resolves (compressed_tensors.quantized_modules) to the modules and schemes that
were quantized; each dequantized matrix lies within its format's error bound of the float weight; the
recorded names and shapes are qwen.py's contract; a float32 run agrees with float64 (the dequantized weights
are float32 values) and picks the same experts; every top-k selection wins by more than ROUTING_MARGIN, also
under the bf16 dot-product emulation (the seed is advanced until it does); the logits are causal; and the
quantization moves the logits away from the float model's by QUANT_MOVE_RANGE (a golden that silently used
the float weights would fail). BF16 cases also get logits_bf16_dot.npy: the unquantized BF16 linears (router,
shared-expert gate, lm_head; hf_fp8 also in_proj_ba) and the MXFP4 ones round their input to bf16, the other
quantized ones do not (the engine's exact quantized path computes in f32). w4a16_g32 and f32_w4a16_g32 also hold float/: the
unquantized checkpoint they were quantized from (compressed_tensors.py compare --input float/ checks what
`lineage quantize` makes of it)."""

import json
import os
from dataclasses import dataclass

import torch

import compressed_tensors as ct
from golden_io import (bf16_dot_golden, case_tokens, check_causal, check_contract, f32_errors,
                       f32_manifest_entries, layers_summary, manifest_head, read_model_dir, relative_rms, write_golden,
                       write_model_dir)
from qwen import (QwenConfig, bf16_weight_names, canonical_weights, intermediate_shapes, qwen_forward,
                  tensor_specs)
from qwen_goldens import NEXT_CONFIG, init_params, min_margin, routing_problem, routing_problems

F32_SELF_CHECK_TOL = 4e-5     # as kimi_k3; nvfp4 reaches 7.5e-6
EXACT_TOL = 1e-12
MAX_SEED_TRIES = 32
# Relative RMS of the quantized model's logits from the float model's (same float weights before quantizing).
QUANT_MOVE_RANGE = (1e-3, 1.0)
# Largest relative RMS error of one dequantized matrix against its float weight, per format.
DEQUANT_ERROR_BOUND = {"int4": 0.2, "int8": 0.02, "fp8": 0.05, "mxfp4": 0.2, "nvfp4": 0.15}

_TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16}
_HF_DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16"}

MODEL_CONFIG = {
    **NEXT_CONFIG,
    "bos_token_id": 248,
    "eos_token_id": 250,
    "head_dim": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "moe_intermediate_size": 32,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0,
    "shared_expert_intermediate_size": 192,
    "vocab_size": 256,
}

IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]
ATTN = r"re:.*self_attn\.(q|k|v|o)_proj$"
GDN = r"re:.*linear_attn\.(in_proj_qkvz|in_proj_ba|out_proj)$"
EXPERTS = r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"
# W8A16: group 128 for o_proj (in-dim 128), group 32 for the rest (in-dims 64, 32, 192): two config groups with
# disjoint targets.
G128 = (r"re:.*self_attn\.o_proj$",)
G32 = (r"re:.*self_attn\.(q|k|v)_proj$", GDN, EXPERTS, r"re:.*mlp\.shared_expert\.(gate|up|down)_proj$")


@dataclass(frozen=True)
class QuantCase:
    name: str
    seed: int
    groups: tuple = ()            # compressed-tensors config groups in order: (preset, group, targets[, actorder])
    hf_fp8: bool = False          # quant_method "fp8" (weight + weight_scale_inv, modules_to_not_convert)
    weights_dtype: str = "BF16"
    T: int = 32
    expect_error: str = ""        # the engine must refuse the checkpoint naming this
    write_float: bool = False     # also write float/: the unquantized checkpoint (for `lineage quantize` tests)


LINEAR = ("Linear",)
CASES = [
    QuantCase("w4a16_g32", 4101, (("W4A16", 32, LINEAR),), write_float=True),
    QuantCase("w4a16_asym_g32", 4111, (("W4A16_ASYM", 32, LINEAR),)),
    QuantCase("w4a16_channel", 4121, (("W4A16", "channel", LINEAR),)),
    QuantCase("w8a16_g128", 4131, (("W8A16", 128, G128), ("W8A16", 32, G32))),
    QuantCase("fp8_block", 4141, (("FP8_BLOCK", None, LINEAR),)),
    QuantCase("fp8_channel", 4151, (("FP8_DYNAMIC", None, LINEAR),)),
    QuantCase("hf_fp8", 4161, hf_fp8=True),
    QuantCase("mxfp4", 4171, (("MXFP4A16", None, LINEAR),)),
    QuantCase("nvfp4", 4181, (("NVFP4A16", None, LINEAR),)),
    # Routed experts int4 group 32 (pack-quantized), every attention / GDN projection FP8 block
    # (float-quantized); the shared experts match no group and stay BF16.
    QuantCase("mixed", 4191, (("W4A16", 32, (EXPERTS,)), ("FP8_BLOCK", None, (ATTN, GDN)))),
    QuantCase("f32_w4a16_g32", 4201, (("W4A16", 32, LINEAR),), weights_dtype="F32", write_float=True),
    # actorder "group": every module has weight_g_idx (a seeded permutation of its columns into groups of 32).
    QuantCase("actorder_g32", 4211, (("W4A16", 32, LINEAR, "group"),), expect_error="weight_g_idx"),
]
FLOAT_DIR = "float"
# HF-native fp8: weight_scale_inv stored F32 (as DeepSeek-V3's; Qwen's releases use BF16 or F16).
HF_FP8_SCALE_DTYPE = torch.float32


def json_config(case: QuantCase) -> dict:
    """config.json without quantization_config."""
    config = json.loads(json.dumps(MODEL_CONFIG))
    config["torch_dtype"] = _HF_DTYPE_NAME[case.weights_dtype]
    return config


def linear_modules(cfg: QwenConfig) -> set:
    """The model's Linear modules (qwen.tensor_specs' matrices) by module name."""
    return {name[:-len(".weight")] for name, _, kind in tensor_specs(cfg) if kind == "matrix"}


def modules_to_not_convert(cfg: QwenConfig) -> list:
    """Qwen's FP8 releases' style: full module names (transformers matches them as substrings; no name here is
    a substring of a quantized module's), norms, conv1d and the GDN gate parameters listed too (not Linear),
    in_proj_ba kept BF16 as the published FP8 GDN models keep in_proj_a / in_proj_b (spec 2.3)."""
    out = ["lm_head", "model.embed_tokens", "model.norm"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [p + "input_layernorm", p + "post_attention_layernorm"]
        if cfg.layer_kind(i) == "gdn":
            out += [p + "linear_attn.in_proj_ba", p + "linear_attn.conv1d", p + "linear_attn.norm",
                    p + "linear_attn.A_log", p + "linear_attn.dt_bias"]
        else:
            out += [p + "self_attn.q_norm", p + "self_attn.k_norm"]
        out += [p + "mlp.gate", p + "mlp.shared_expert_gate"]
    return out


def case_schemes(case: QuantCase) -> list:
    """[(Scheme, targets)] of the case's config groups."""
    return [(ct.make_scheme(g[0], g[1], g[3] if len(g) > 3 else None), list(g[2])) for g in case.groups]


def quant_config(case: QuantCase, cfg: QwenConfig) -> dict:
    if case.hf_fp8:
        return ct.hf_fp8_config(modules_to_not_convert(cfg))
    return ct.quantization_config_groups(case_schemes(case), IGNORE)


def module_plan(case: QuantCase, cfg: QwenConfig, tensors: dict) -> dict:
    """{module: Scheme} the case quantizes."""
    linears = linear_modules(cfg)
    if case.hf_fp8:
        skip = modules_to_not_convert(cfg)
        return {m: ct.PRESETS["HF_FP8"] for m in sorted(linears) if not any(s in m for s in skip)}
    return ct.plan(tensors, case_schemes(case), IGNORE, linear_modules=linears)


def g_indices(plan: dict, tensors: dict, seed: int) -> dict:
    """{module: g_idx int32 [cols]} for actorder modules: columns of a seeded permutation, 32 per group."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for module, scheme in sorted(plan.items()):
        if scheme.actorder == "group":
            cols = tensors[module + ".weight"].shape[1]
            perm = torch.randperm(cols, generator=gen)
            g = torch.empty(cols, dtype=torch.int32)
            g[perm] = (torch.arange(cols) // scheme.group_size).to(torch.int32)
            out[module] = g
    return out


def quantized_checkpoint(case: QuantCase, cfg: QwenConfig, seed: int) -> tuple:
    """(float checkpoint, quantized checkpoint, plan) for one seed."""
    dtype = _TORCH_DTYPE[case.weights_dtype]
    floats = {name: t.to(dtype) for name, t in init_params(cfg, torch.Generator().manual_seed(seed)).items()}
    plan = module_plan(case, cfg, floats)
    quantized = ct.quantize_checkpoint(floats, plan, g_idx=g_indices(plan, floats, seed),
                                       scale_dtype=HF_FP8_SCALE_DTYPE if case.hf_fp8 else None)
    return floats, quantized, plan


def reference_weights(cfg: QwenConfig, config: dict, stored: dict) -> dict:
    """Canonical float64 weights: quantized modules dequantized, the rest widened."""
    return canonical_weights(cfg, ct.dequantized_checkpoint(config, stored), torch.float64)


def engine_dot_view(deq: dict, plan: dict) -> dict:
    """deq with the MXFP4 modules' weights in bfloat16 (exact: an e2m1 value times a power of two), so that
    bf16_weight_names names them too: the engine's bf16 dot mode rounds the input of BF16 and MXFP4
    linears alike."""
    mx = {m + ".weight" for m, scheme in plan.items() if scheme.kind == "mxfp4"}
    return {n: t.to(torch.bfloat16) if n in mx else t for n, t in deq.items()}


def choose_seed(case: QuantCase, cfg: QwenConfig, config: dict, tokens: torch.Tensor) -> tuple:
    """(seed, float checkpoint, quantized checkpoint, plan): the first seed from case.seed whose dequantized
    model routes with margins (float64 and under the bf16 dot-product emulation, the same experts)."""
    problem = ""
    for seed in range(case.seed, case.seed + MAX_SEED_TRIES):
        floats, quantized, plan = quantized_checkpoint(case, cfg, seed)
        deq = ct.dequantized_checkpoint(config, quantized)
        problems = routing_problems(cfg, engine_dot_view(deq, plan), tokens, case.weights_dtype)
        if not problems:
            return seed, floats, quantized, plan
        problem = problems[0]
    raise AssertionError(f"quant/{case.name}: no seed in {case.seed}..{case.seed + MAX_SEED_TRIES - 1} routes "
                         f"with margins; last: {problem}")


def _error_kind(scheme: ct.Scheme) -> str:
    return f"int{scheme.num_bits}" if scheme.kind == "int" else scheme.kind


def check_checkpoint(label: str, written: dict, config: dict, stored: dict, plan: dict, floats: dict) -> float:
    """Raises unless the checkpoint read back holds exactly the tensors written (dtype, shape, bytes), its
    quantization_config resolves to plan (same modules, same kind, bits, strategy, group and block), and each
    dequantized matrix is within DEQUANT_ERROR_BOUND of its float weight. Returns the worst such error."""
    if sorted(written) != sorted(stored):
        raise AssertionError(f"{label}: the checkpoint read back has other tensors than written")
    for name, t in written.items():
        problem = ct.first_difference(t, stored[name])
        if problem:
            raise AssertionError(f"{label}: '{name}' read back: {problem}")
    found = ct.quantized_modules(config, stored)
    if sorted(found) != sorted(plan):
        raise AssertionError(f"{label}: quantization_config resolves to {len(found)} modules, "
                             f"{len(plan)} were quantized: {sorted(set(found) ^ set(plan))[:4]}")
    key = lambda s: (s.kind, s.num_bits, s.strategy, s.group_size, s.block_structure, s.symmetric,  # noqa: E731
                     s.actorder, s.hf)
    worst = 0.0
    decoded = ct.decode_checkpoint(config, stored)
    for module, scheme in plan.items():
        if key(found[module]) != key(scheme):
            raise AssertionError(f"{label}: '{module}' resolves to {found[module]}, quantized as {scheme}")
        err = relative_rms(decoded[module + ".weight"], floats[module + ".weight"])
        if not 0 < err < DEQUANT_ERROR_BOUND[_error_kind(scheme)]:
            raise AssertionError(f"{label}: '{module}' dequantized lies {err:.3g} from its float weight")
        worst = max(worst, err)
    return worst


def schemes_manifest(case: QuantCase, config: dict) -> list:
    qc = config["quantization_config"]
    if case.hf_fp8:
        return [{"quant_method": "fp8", "weight_block_size": qc["weight_block_size"],
                 "weight_scale_inv_dtype": "F32", "modules_to_not_convert": len(qc["modules_to_not_convert"])}]
    out = []
    for name, group in qc["config_groups"].items():
        w = group["weights"]
        out.append({"group": name, "format": group["format"], "targets": group["targets"],
                    **{k: w[k] for k in ("num_bits", "type", "symmetric", "strategy", "group_size",
                                         "block_structure", "actorder")}})
    return out


def build_case(case: QuantCase, case_dir: str) -> str:
    """Writes case_dir (quantized HF model directory) and case_dir/golden/. Returns a one-line summary."""
    label = f"quant/{case.name}"
    cfg = QwenConfig.from_json(json_config(case))
    config = {**json_config(case), "quantization_config": quant_config(case, cfg)}
    tokens_np = case_tokens(case, cfg)
    tokens = torch.from_numpy(tokens_np).long()
    seed, floats, quantized, plan = choose_seed(case, cfg, config, tokens)
    write_model_dir(case_dir, config, quantized, sort_keys=True)
    config, stored = read_model_dir(case_dir)
    cfg = QwenConfig.from_json(config)
    worst_deq = check_checkpoint(label, quantized, config, stored, plan, floats)

    deq = ct.dequantized_checkpoint(config, stored)
    w64 = canonical_weights(cfg, deq, torch.float64)
    rec64, routing64 = {}, []
    qwen_forward(cfg, w64, tokens, rec64, routing=routing64)
    check_contract(label, rec64, intermediate_shapes(cfg, case.T))
    problem = routing_problem(cfg, routing64)
    if problem:
        raise AssertionError(f"{label}: {problem}")
    rec32 = {}
    qwen_forward(cfg, canonical_weights(cfg, deq, torch.float32), tokens, rec32)
    errors, worst = f32_errors(label, rec32, rec64, F32_SELF_CHECK_TOL)
    check_causal(label, qwen_forward(cfg, w64, tokens[:case.T // 2]), rec64["logits"], EXACT_TOL)
    move = relative_rms(rec64["logits"], qwen_forward(cfg, canonical_weights(cfg, floats, torch.float64), tokens))
    lo, hi = QUANT_MOVE_RANGE
    if not lo < move < hi:
        raise AssertionError(f"{label}: quantization moves the logits by {move:.3g}, expected {lo:g}..{hi:g}")

    bf16 = bf16_weight_names(cfg, engine_dot_view(deq, plan))
    qc = config["quantization_config"]
    manifest = manifest_head(
        "qwen3_next", case, seed=seed, quant_method=qc["quant_method"],
        format=qc.get("format", "fp8 (HF-native)"), schemes=schemes_manifest(case, config),
        ignore=qc.get("ignore", qc.get("modules_to_not_convert")),
        quantized_modules=sorted(plan), dequantized_max_rel_err=float(f"{worst_deq:.3e}"),
        logits_move_from_float=float(f"{move:.3e}"),
        weights="qwen.py forward on compressed_tensors.dequantize of every quantized module (code x scale once "
                "in float32, widened), the other tensors widened",
        bf16_dot_linears=sorted(m + ".weight" for m in linear_modules(cfg) if m + ".weight" in bf16)
        if case.weights_dtype == "BF16" else [],
        layer_types=[cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)],
        ffn_types=[cfg.ffn_kind(i) for i in range(cfg.num_hidden_layers)], rotary_dim=cfg.rotary_dim,
        **({"expect_error": case.expect_error} if case.expect_error else {}))
    if case.write_float:
        write_model_dir(os.path.join(case_dir, FLOAT_DIR), json_config(case), floats, sort_keys=True)
        manifest["float_model"] = FLOAT_DIR
    golden_dir = os.path.join(case_dir, "golden")
    write_golden(golden_dir, tokens_np, rec64, manifest, f32_manifest_entries(errors))
    dot = bf16_dot_golden(golden_dir, label, case.weights_dtype,
                          lambda t: qwen_forward(cfg, w64, t, bf16_inputs=bf16), tokens, rec64["logits"])
    return (f"{case.weights_dtype} {layers_summary(cfg, {'gdn': 'G', 'attention': 'A'})} "
            f"{qc.get('format', 'hf fp8')}: {len(plan)} quantized matrices, {len(stored)} tensors, seed={seed}, "
            f"dequant err <= {worst_deq:.2g}, logits {move:.2g} from float, f32 self-check {errors[worst]:.1e}, "
            f"routing margin {min_margin(routing64):.1e}{dot}"
            f"{f', expect_error {case.expect_error}' if case.expect_error else ''}")
