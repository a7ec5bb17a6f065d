"""Kimi K3 golden cases (family "kimi_k3"): each writes a model directory in one of K3's layouts (the
published KimiK3ForConditionalGeneration config.json with every field of the released text_config and
vision_config at tiny sizes and "language_model."-prefixed text tensors plus vision stand-ins; the same
with the Kimi-K3-0.40B config's field set; or the text-only KimiLinearForCausalLM layout) with seeded random
weights, MXFP4-packed routed experts (and more, in all_packed), and golden/ with the float64 intermediates
of kimi_k3.py. Before writing, every case runs kimi_linear_goldens.self_check on kimi_k3's forward (the
contract, float32 agreement and the same experts, routing margins, causality, the split feed, absorbed =
explicit MLA, kv_a_layernorm's eps) and K3's own checks (_k3_checks: q_a_layernorm's eps, the lower-bound
gate's range, SiTU's caps, non-uniform AttnRes mixes, the -inf group mask). The BF16 case also gets the
logits with the engine's bf16 dot products emulated (logits_bf16_dot.npy)."""

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import torch

from golden_io import (METRIC, bf16_dot_golden, case_tokens, layers_summary, read_model_dir, relative_rms,
                       write_golden)
from kimi_k3 import (ARCHITECTURE, MODEL_TYPE, PACKED_SUFFIX, SCALE_SUFFIX, TEXT_ARCHITECTURE, TEXT_MODEL_TYPE,
                     TEXT_PREFIX, K3Config, bf16_linear_inputs, canonical_weights, intermediate_shapes,
                     k3_forward, mxfp4_values, pack_mxfp4, tensor_specs)
from kimi_linear import initial_cache
from kimi_linear_goldens import (_A_RANGE, _KV_A_GAINS, _MATRIX_GAIN, ENGINE_TOL_FACTOR, ENGINE_TOL_FLOOR,
                                 ModelFunctions, _matrix_key, check_routing, init_value, self_check, write_model_dir)

# Five or six layers of AttnRes-mixed sublayers, SiTU near its caps, two adjacent MLA layers: float32 drifts
# to ~1e-5 by the last layer (worst in the last MoE; 4e-6 to 9e-6 whichever kernel OpenBLAS picks), so the
# sanity bound is 4e-5.
F32_SELF_CHECK_TOL = 4e-5
K3 = ModelFunctions(MODEL_TYPE, k3_forward, canonical_weights, intermediate_shapes, initial_cache,
                    F32_SELF_CHECK_TOL)
# The bf16-dot logits' distance from the exact ones. Rounding every linear's input roughly doubles the
# relative deviation per layer here (as in Kimi Linear's cases), and over four MoE layers it flips some
# expert selections (each flip with its margin held in the emulated run), which moves the logits by
# ~0.1-0.3: the upper bound only says the emulation did not run away.
BF16_DOT_RANGE = (1e-4, 0.5)

_TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16}
_HF_DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16"}
# K3 keeps these F32 whatever the weights dtype (spec 8.3: A_log, dt_bias, the short convs, o_norm and
# the router's correction bias).
_ALWAYS_F32 = ("A_log", "dt_bias", "_conv1d.weight", "o_norm.weight", "e_score_correction_bias")

_TEXT_AUTO_MAP = {"AutoConfig": "configuration_kimi_k3.KimiLinearConfig",
                  "AutoModel": "modeling_kimi_linear.KimiLinearModel",
                  "AutoModelForCausalLM": "modeling_kimi_linear.KimiLinearForCausalLM"}
_AUTO_MAP = {"AutoConfig": "configuration_kimi_k3.KimiK3Config",
             "AutoModel": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
             "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForConditionalGeneration"}

# The published quantization_config (text_config of /work/shared/data/kimi-k3/config.json), verbatim.
QUANTIZATION_CONFIG = {
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "input_activations": None, "output_activations": None,
        "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8", "strategy": "group",
                    "symmetric": True, "type": "float", "zp_dtype": None}}},
    "format": "mxfp4-pack-quantized",
    "global_compression_ratio": None,
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

# The fields both released text_configs (Kimi-K3 and Kimi-K3-0.40B) have, at test size. CASES override some.
_TEXT_COMMON = {
    "_name_or_path": "",
    "activation_situ_beta": 0.5,          # released 4.0; small enough here that the cap bites
    "activation_situ_linear_beta": 2.0,   # released 25.0
    "attn_res_block_size": 2,
    "auto_map": _TEXT_AUTO_MAP,
    "chunk_size_feed_forward": 0,
    "first_k_dense_replace": 1,
    "hidden_act": "situ",
    "hidden_size": 96,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
    "initializer_range": 0.02,
    "intermediate_size": 160,
    "is_encoder_decoder": False,
    "kv_lora_rank": 32,
    "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "latent_moe_use_norm": True,
    "linear_attn_config": {
        "full_attn_layers": [4, 5],
        "gate_lower_bound": -5.0,
        "head_dim": 16,
        "kda_layers": [1, 2, 3],
        "num_heads": 3,
        "short_conv_kernel_size": 4,
        "use_full_rank_gate": True,
    },
    "max_position_embeddings": 4096,
    "mla_use_nope": True,
    "mla_use_output_gate": True,
    "model_type": TEXT_MODEL_TYPE,
    "moe_intermediate_size": 128,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "num_attention_heads": 4,
    "num_expert_group": 1,
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_hidden_layers": 5,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "num_shared_experts": 1,
    "output_attentions": False,
    "output_hidden_states": False,
    "problem_type": None,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "return_dict": True,
    "rms_norm_eps": 1e-05,
    "routed_expert_hidden_size": 64,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "use_cache": True,
    "use_grouped_topk": True,
    "v_head_dim": 16,
    "vocab_size": 256,
}
# Kimi-K3's text_config adds the ids and the generation defaults of transformers' PretrainedConfig.
_TEXT_PUBLISHED = {
    **_TEXT_COMMON,
    "add_cross_attention": False, "architectures": [TEXT_ARCHITECTURE], "bad_words_ids": None,
    "begin_suppress_tokens": None, "bos_token_id": 250, "cross_attention_hidden_size": None,
    "decoder_start_token_id": None, "diversity_penalty": 0.0, "do_sample": False, "dtype": "float32",
    "early_stopping": False, "encoder_no_repeat_ngram_size": 0, "eos_token_id": 252,
    "exponential_decay_length_penalty": None, "finetuning_task": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "is_decoder": False, "length_penalty": 1.0, "max_length": 20, "min_length": 0,
    "no_repeat_ngram_size": 0, "num_beam_groups": 1, "num_beams": 1, "num_return_sequences": 1,
    "output_scores": False, "pad_token_id": 255, "prefix": None, "pruned_heads": {},
    "quantization_config": QUANTIZATION_CONFIG, "remove_invalid_values": False, "repetition_penalty": 1.0,
    "return_dict_in_generate": False, "sep_token_id": None, "suppress_tokens": None, "task_specific_params": None,
    "temperature": 1.0, "tf_legacy_loss": False, "tie_encoder_decoder": False, "tokenizer_class": None,
    "top_k": 50, "top_p": 1.0, "torchscript": False, "transformers_version": "4.56.2", "typical_p": 1.0,
    "use_bfloat16": False,
}
# Kimi-K3-0.40B's text_config has a smaller field set, head_dim and RoPE fields (unused under NoPE) and
# no quantization_config (all_packed adds one).
_TEXT_SMALL = {
    **_TEXT_COMMON,
    "architectures": None, "bos_token_id": 1, "dtype": None, "eos_token_id": 2, "head_dim": 16, "pad_token_id": 0,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rope_theta": 10000.0,
}
_VISION_COMMON = {
    "activation_func": "gelu_pytorch_tanh", "attn_bias": False, "init_pos_emb_height": 8, "init_pos_emb_time": 4,
    "init_pos_emb_width": 8, "linear_bias": False, "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool",
    "mlp_type": "mlp2", "mm_hidden_size": 32, "mm_projector_type": "patchmergerv2", "norm_type": "rmsnorm",
    "patch_embed_proj_bias": False, "patch_size": 14, "pos_emb_interpolation_mode": "bilinear",
    "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
    "qkv_hidden_size": 96, "text_hidden_size": 96, "vt_hidden_size": 32, "vt_intermediate_size": 64,
    "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1,
}
_VISION_PUBLISHED = {**_VISION_COMMON, "_attn_implementation": "flash_attention_2"}
_VISION_SMALL = {
    **_VISION_COMMON, "_name_or_path": "", "architectures": None, "chunk_size_feed_forward": 0, "dtype": None,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "is_encoder_decoder": False,
    "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "model_type": "", "output_attentions": False,
    "output_hidden_states": False, "problem_type": None, "return_dict": True,
}
# Stand-ins for the vision tower and projector (the engine skips both prefixes): shapes of the tiny
# vision_config, in the weights dtype.
_VISION_TENSORS = {
    "vision_tower.patch_embed.proj.weight": [32, 3, 14, 14],
    "vision_tower.encoder.blocks.0.wqkv.weight": [96, 32],
    "vision_tower.encoder.final_layernorm.weight": [32],
    "mm_projector.pre_norm.weight": [32],
    "mm_projector.proj.0.weight": [128, 128],
    "mm_projector.proj.2.weight": [96, 128],
}

# Which Linears a case stores MXFP4, by group (canonical name contains the marker).
_PACK_GROUPS = {"experts": (".experts.",), "shared_experts": (".shared_experts.",),
                "latent_proj": (".routed_expert_down_proj.", ".routed_expert_up_proj.")}


@dataclass(frozen=True)
class K3Case:
    name: str
    seed: int
    layout: str = "published"          # "published" (Kimi-K3), "small" (Kimi-K3-0.40B's fields), "text_only"
    text: dict = field(default_factory=dict, hash=False)    # text_config overrides
    linear: dict = field(default_factory=dict, hash=False)  # linear_attn_config overrides (None: leave out)
    weights_dtype: str = "F32"         # non-expert weights; see _ALWAYS_F32
    packed: tuple = ("experts",)       # _PACK_GROUPS stored MXFP4
    a_log: str = "head_dim"            # A_log stored [head_dim] (K3) or [num_heads]
    shards: int = 1
    T: int = 70                        # crosses the engine's 64-token KDA chunk
    bias_mean: float = 0.0             # e_score_correction_bias ~ N(bias_mean, bias_std)
    bias_std: float = 0.1
    checks: tuple = ()                 # "mask_change": the -inf mask selects differently from 0.0

    def text_config(self) -> dict:
        base = _TEXT_SMALL if self.layout == "small" else _TEXT_PUBLISHED
        unknown = set(self.text) - set(base)
        unknown |= {f"linear_attn_config.{k}" for k in set(self.linear) - set(base["linear_attn_config"])}
        if unknown:
            raise ValueError(f"kimi_k3/{self.name}: not config fields: {sorted(unknown)}")
        d = json.loads(json.dumps(base))
        d.update(self.text)
        for k, v in self.linear.items():
            if v is None:
                del d["linear_attn_config"][k]
            else:
                d["linear_attn_config"][k] = v
        d["num_key_value_heads"] = d["num_attention_heads"]
        if "head_dim" in d:
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if d.get("dtype") is not None:
            d["dtype"] = _HF_DTYPE_NAME[self.weights_dtype]
        if self.layout == "text_only" or not self.packed:
            d.pop("quantization_config", None)
        else:
            quant = json.loads(json.dumps(QUANTIZATION_CONFIG))
            if "shared_experts" in self.packed:  # keep the ignore list true to the tensors
                quant["ignore"].remove("re:.*shared_experts.*")
            d["quantization_config"] = quant
        return d

    def json_config(self) -> dict:
        text = self.text_config()
        if self.layout == "text_only":
            return text
        top = {"architectures": [ARCHITECTURE], "auto_map": _AUTO_MAP, "dtype": _HF_DTYPE_NAME[self.weights_dtype],
               "ignore_index": -100, "media_placeholder_token_id": 253, "model_type": MODEL_TYPE,
               "pad_token_id": text["pad_token_id"], "text_config": text}
        if self.layout == "small":
            return {**top, "transformers_version": "5.15.0.dev0", "use_cache": False, "vision_config": _VISION_SMALL}
        return {**top, "bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"],
                "image_placeholder": "<|kimi_image_placeholder|>", "tie_word_embeddings": False,
                "vision_config": _VISION_PUBLISHED}

    def packs(self, name: str) -> bool:
        return any(marker in name for g in self.packed for marker in _PACK_GROUPS[g])


CASES = [
    # The published layout: F32 non-expert weights, MXFP4 routed experts, the lower-bound KDA gate at
    # -5 with channels near it, A_log [head_dim], layers KKKMM (the last two MLA, as K3's 92 and 93),
    # blocks of 2 layers, full-rank KDA gate, normed latent MoE.
    K3Case("mxfp4_routed", 4101),
    # The same with BF16 non-expert weights (_ALWAYS_F32 stay F32), 3 shards + index.
    K3Case("bf16_sharded", 4102, weights_dtype="BF16", shards=3),
    # Kimi-K3-0.40B's config fields, softplus KDA gate (no gate_lower_bound), shared experts and the
    # latent down/up projections MXFP4 too, blocks of 3, layers KKKMKM, A_log [num_heads].
    K3Case("all_packed", 4122, layout="small", text={"attn_res_block_size": 3, "num_hidden_layers": 6},
           linear={"gate_lower_bound": None, "kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6]},
           packed=("experts", "shared_experts", "latent_proj"), a_log="num_heads"),
    # 16 experts in 4 groups, 2 kept, k = 4; negative biases, so the -inf mask selects differently from
    # the 0.0 one; two shared experts (one MLP of 2 x 128).
    K3Case("grouped", 4104, text={"num_experts": 16, "num_expert_group": 4, "topk_group": 2,
                                  "num_experts_per_token": 4, "num_shared_experts": 2},
           bias_mean=-0.4, bias_std=0.3, checks=("mask_change",)),
    # KimiLinearForCausalLM with K3's fields at top level: no quantization (F32 experts), low-rank KDA
    # gate, no latent norm (routed_scaling_factor then matters), up branch uncapped, lower bound -3.
    K3Case("text_only", 4105, layout="text_only", packed=(),
           text={"latent_moe_use_norm": False, "activation_situ_linear_beta": None, "routed_scaling_factor": 2.446},
           linear={"use_full_rank_gate": False, "gate_lower_bound": -3.0}),
    # As many KDA as MLA heads (4), the shape llama.cpp's kimi-k3 loads (it sizes both from one head count),
    # and F32 experts (llama.cpp multiplies MXFP4 with 8-bit activations): the GGUF comparisons run llama.cpp
    # on this checkpoint's mirror, f32 throughout (tests/gguf_llama_test.cpp).
    K3Case("f32_heads_equal", 4131, linear={"num_heads": 4}, packed=()),
]

# q_a_proj and kv_a_proj_with_mqa's latent rows small (mean square ~0.1), so the 1e-6 eps of their norms
# shows past the engine's tolerance, deeper in the model than Kimi Linear's cases.
_K3_KV_A_GAINS = (0.3, _KV_A_GAINS[1])
_K3_GAIN = {**_MATRIX_GAIN, "q_a_proj.weight": 0.3, "q_b_proj.weight": 1.5, "g_proj.weight": 1.5,
            "routed_expert_down_proj.weight": 1.0, "routed_expert_up_proj.weight": 1.0}
# Lower-bound gate a = lb sigmoid(exp(A_log) (f + dt_bias)): exp(A_log) ~ U(0.5, 2) per head; a quarter of
# the channels get dt_bias ~ U(6, 9) (decay near lb every step), the rest U(-4, 1).
_LB_A_RANGE = (0.5, 2.0)
_LB_DT_FAST, _LB_DT_SLOW, _LB_FAST_SHARE = (6.0, 9.0), (-4.0, 1.0), 0.25
# AttnRes pseudo-queries ~ N(0, gain / sqrt(D)): logits of std ~1.5, so the mixes are far from uniform.
_RES_PROJ_GAIN = 1.5
# RMS of the 16 MXFP4 code values, and of 2^u for u uniform in {-1, 0, 1} (the scale spread).
_CODE_RMS = float(mxfp4_values().pow(2).mean().sqrt())
_SCALE_SPREAD_RMS = math.sqrt((0.25 + 1 + 4) / 3)


def _mxfp4_matrix(shape: list, gain: float, gen: torch.Generator) -> tuple:
    """Random MXFP4 codes and scales whose values have std ~ gain / sqrt(cols): (weight_packed,
    weight_scale). Scales are 2^(s0 + u - 127), u uniform in {-1, 0, 1} per 32-column group."""
    rows, cols = shape
    codes = torch.randint(0, 16, (rows, cols), generator=gen)
    s0 = round(127 + math.log2(gain / math.sqrt(cols) / (_CODE_RMS * _SCALE_SPREAD_RMS)))
    scale = s0 + torch.randint(-1, 2, (rows, cols // 32), generator=gen)
    return pack_mxfp4(codes, scale)


def init_checkpoint(case: K3Case, cfg: K3Config, gen: torch.Generator) -> dict:
    """The checkpoint tensors, final names and dtypes: embeddings N(0, 1), Linears N(0, gain / sqrt(in))
    (_K3_GAIN; the packed ones random MXFP4 codes and scales of that std), norm weights 1 + N(0, 0.1),
    res_proj N(0, 1.5 / sqrt(D)), conv taps N(0, 1/W), A_log and dt_bias per the gate (lower bound: above;
    softplus: Kimi Linear's), A_log's entries past num_heads zero, router bias N(bias_mean, bias_std);
    then the vision stand-ins N(0, 0.02)."""
    H, K = cfg.kda_num_heads, cfg.kda_head_dim
    dtype = _TORCH_DTYPE[case.weights_dtype]
    prefix = "" if case.layout == "text_only" else TEXT_PREFIX
    out = {}
    for name, shape, kind in tensor_specs(cfg, {"head_dim": K, "num_heads": H}[case.a_log]):
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        uniform = torch.rand(shape, generator=gen, dtype=torch.float32)
        if kind == "matrix" and case.packs(name):
            base = prefix + name[:-len(".weight")]
            out[base + PACKED_SUFFIX], out[base + SCALE_SUFFIX] = _mxfp4_matrix(shape, _K3_GAIN[_matrix_key(name)], gen)
            continue
        if kind == "res_proj":
            value = (_RES_PROJ_GAIN / math.sqrt(shape[-1])) * noise
        elif kind == "A_log":
            lo, hi = _LB_A_RANGE if cfg.gate_lower_bound is not None else _A_RANGE
            value = torch.zeros(shape)
            value[:H] = torch.log(lo + (hi - lo) * uniform[:H])
        elif kind == "dt_bias" and cfg.gate_lower_bound is not None:
            fast = torch.rand(shape, generator=gen) < _LB_FAST_SHARE
            (flo, fhi), (slo, shi) = _LB_DT_FAST, _LB_DT_SLOW
            value = torch.where(fast, flo + (fhi - flo) * uniform, slo + (shi - slo) * uniform)
        else:
            value = init_value(name, shape, kind, noise, uniform, cfg, (case.bias_mean, case.bias_std), _K3_GAIN,
                               _K3_KV_A_GAINS)
        out[prefix + name] = value if name.endswith(_ALWAYS_F32) else value.to(dtype)
    if case.layout != "text_only":
        for name, shape in _VISION_TENSORS.items():
            out[name] = (0.02 * torch.randn(shape, generator=gen)).to(dtype)
    return out


def _moved(cfg: K3Config, w64: dict, tokens: torch.Tensor, rec64: dict, name: str = "logits") -> float:
    """Relative RMS by which rec64[name] moves when the model runs with cfg instead."""
    rec = {}
    k3_forward(cfg, w64, tokens, rec)
    return relative_rms(rec[name], rec64[name])


def _k3_checks(case: K3Case, cfg: K3Config, w64: dict, tokens: torch.Tensor, rec64: dict, routing_stats: dict,
               errors: dict) -> str:
    """K3's own self-checks (raise on failure); returns their notes."""
    label = f"kimi_k3/{case.name}"
    notes = []
    # q_a_layernorm at rms_norm_eps must move attn.q past 2x the engine's tolerance, as kv_a's latent.
    other = dataclasses.replace(cfg, q_a_norm_eps=cfg.rms_norm_eps)
    rec_eps = {}
    k3_forward(other, w64, tokens, rec_eps)
    ratio = min(relative_rms(rec_eps[n], rec64[n]) / max(ENGINE_TOL_FACTOR * errors[n], ENGINE_TOL_FLOOR)
                for i in range(cfg.num_hidden_layers) if cfg.layer_kind(i) == "mla" for n in [f"h{i}.attn.q"])
    if ratio < 2:
        raise AssertionError(f"{label}: q_a_layernorm eps {cfg.rms_norm_eps} moves attn.q by only {ratio:.2g} x tol")
    notes.append(f"wrong q_a eps {ratio:.1f}x tol")
    decays = torch.cat([t.flatten() for n, t in rec64.items() if n.endswith("attn.log_decay")])
    if cfg.gate_lower_bound is not None:
        lb = cfg.gate_lower_bound
        if not (decays > lb).all() or not (decays <= 0).all():
            raise AssertionError(f"{label}: log decays outside ({lb}, 0]: {float(decays.min())}..{float(decays.max())}")
        near = float((decays < 0.98 * lb).double().mean())
        if near < 0.05:
            raise AssertionError(f"{label}: only {near:.1%} of the log decays lie near the lower bound {lb}")
        notes.append(f"log decay {float(decays.min()):.3f}..{float(decays.max()):.2g} ({near:.0%} below {0.98 * lb:g})")
    # SiTU: each cap must matter, and SiTU must be far from SwiGLU.
    if cfg.hidden_act == "situ":
        variants = {"SwiGLU": dataclasses.replace(cfg, hidden_act="silu"),
                    "no gate cap": dataclasses.replace(cfg, situ_beta=1e30)}
        if cfg.situ_linear_beta is not None:
            variants["no up cap"] = dataclasses.replace(cfg, situ_linear_beta=None)
        for what, variant in variants.items():
            moved = _moved(variant, w64, tokens, rec64)
            if moved < (0.05 if what == "SwiGLU" else 0.01):
                raise AssertionError(f"{label}: logits move only {moved:.3g} with {what}")
            notes.append(f"{what} {moved:.2g}")
    # AttnRes: every mix is far from uniform.
    skew = math.inf
    for name, p in rec64.items():
        if name.endswith("res.weights"):
            skew = min(skew, float((p - 1.0 / p.shape[1]).abs().max()))
    if skew < 0.05:
        raise AssertionError(f"{label}: an AttnRes mix stays within {skew:.3g} of uniform")
    notes.append(f"AttnRes skew >= {skew:.2f}")
    if "mask_change" in case.checks:
        if routing_stats["zero_mask_changes"] < 1:
            raise AssertionError(f"{label}: a 0.0 group mask would select the same experts as -inf")
        notes.append(f"0.0 mask would change {routing_stats['zero_mask_changes']} selections")
    return "".join(", " + n for n in notes)


def build_case(case: K3Case, case_dir: str) -> str:
    """Writes case_dir (model directory) and case_dir/golden/. Returns a one-line summary."""
    cfg = K3Config.from_json(case.json_config())
    gen = torch.Generator().manual_seed(case.seed)
    write_model_dir(case, case_dir, init_checkpoint(case, cfg, gen))
    config, tensors = read_model_dir(case_dir)
    cfg = K3Config.from_json(config)  # the reference runs on exactly what the C++ side will read
    tokens_np = case_tokens(case, cfg)
    tokens = torch.from_numpy(tokens_np).long()
    w64 = canonical_weights(cfg, tensors, torch.float64)
    rec64, routing64 = {}, []
    k3_forward(cfg, w64, tokens, rec64, routing=routing64)
    per_name, notes = self_check(case, cfg, tensors, tokens, rec64, routing64, model=K3, extra_checks=_k3_checks)
    packed = sorted(n for n in tensors if n.endswith(PACKED_SUFFIX))
    a_log = next(t for n, t in tensors.items() if n.endswith("A_log"))
    manifest = {
        "model": MODEL_TYPE,
        "case": case.name,
        "layout": case.layout,
        "weights_dtype": case.weights_dtype,
        "mxfp4_groups": list(case.packed),
        "compute_dtype": "float64",
        "metric": METRIC,
        "T": case.T,
        "layer_types": [cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)],
        "ffn_types": [cfg.ffn_kind(i) for i in range(cfg.num_hidden_layers)],
        "attn_res_block_size": cfg.attn_res_block_size,
        "a_log_shape": list(a_log.shape),
        "state_layout": "KDA attn.state is the final recurrent state S per head, [H, K, V]",
    }
    golden_dir = os.path.join(case_dir, "golden")
    write_golden(golden_dir, tokens_np, rec64, manifest, per_name)
    bf16 = bf16_linear_inputs(cfg, tensors)
    if bf16:
        routing = []
        k3_forward(cfg, w64, tokens, bf16_inputs=bf16, routing=routing)
        check_routing(f"kimi_k3/{case.name} (bf16 dot products)", cfg, routing)
    dot = bf16_dot_golden(golden_dir, f"kimi_k3/{case.name}", case.weights_dtype,
                          lambda t: k3_forward(cfg, w64, t, bf16_inputs=bf16), tokens, rec64["logits"],
                          BF16_DOT_RANGE)
    files = f"{case.shards} shards" if case.shards > 1 else "1 file"
    return (f"{case.layout} {case.weights_dtype}, {len(packed)} MXFP4 matrices, "
            f"layers {layers_summary(cfg, {'kda': 'K', 'mla': 'M'})} "
            f"B={cfg.attn_res_block_size} D={cfg.hidden_size} E={cfg.num_experts} k={cfg.num_experts_per_token} "
            f"T={case.T}; {len(tensors)} tensors in {files}, {len(rec64)} intermediates, {notes}{dot}")
