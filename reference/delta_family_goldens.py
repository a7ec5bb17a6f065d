"""Linear-attention family golden cases (linear_attn, delta_net, gated_deltanet, kda): each writes an fla HF
model directory (config.json + model.safetensors) with seeded random weights, and golden/ with the float64
intermediates of delta_family.py, after checking that a float32 run agrees, that the model is causal and
that feeding the tokens in two parts (carrying S and the conv tails) gives the one-shot state. BF16 cases
also get the logits with the engine's bf16 dot products emulated (logits_bf16_dot.npy)."""

import math
import os
from dataclasses import dataclass, field

import torch

import golden_io
from delta_family import (ARCHITECTURES, COMMON_DEFAULTS, MIXER_DEFAULTS, MODEL_TYPES, FlaConfig,
                          bf16_weight_names, canonical_weights, fla_forward, initial_cache,
                          intermediate_shapes, tensor_specs)
from golden_io import (FamilyCases, bf16_dot_golden, case_tokens, check_causal, check_contract, check_split,
                       f32_errors, f32_manifest_entries, manifest_head, read_model_dir, write_golden)

# A float32 PyTorch run must agree with the float64 reference this well on every intermediate.
# OpenBLAS's kernel choice (OPENBLAS_CORETYPE=Haswell or the CPU's own) moves these float32 figures by up
# to 2x (measured: 1e-6 to 2.2e-6 here), so the bound sits well above both; a float32 path that
# went wrong is off by 1e-3 or more.
F32_SELF_CHECK_TOL = 6e-6
# Logits of a prefix, and states after a split feed, must match the one-shot float64 run this well.
EXACT_TOL = 1e-12

_TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16}
_HF_DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16"}
# Released checkpoints keep the gate parameters in float32 whatever the weights dtype (spec 4A.1, 5B.1).
_ALWAYS_F32 = ("A_log", "dt_bias")


@dataclass(frozen=True)
class FlaCase:
    model_type: str
    name: str
    config: dict = field(hash=False)  # config.json fields (fla names) that differ from fla's defaults
    seed: int = 0
    T: int = 70                       # crosses the 32- and 64-token chunk boundaries
    weights_dtype: str = "F32"        # "F32" or "BF16" (A_log and dt_bias stay F32)
    minimal: bool = False             # config.json holds model_type and `config` only: the rest is fla's defaults

    # config.json fields that are lineage's, not fla's (delta_family.FlaConfig documents them).
    LINEAGE_FIELDS = {"linear_attn": {"use_short_conv", "conv_size"}}

    def json_config(self) -> dict:
        """config.json as fla's configuration class would save it: every field, defaults filled in (or,
        minimal, only model_type and the case's own fields, so that the readers fill in the defaults)."""
        d = {"architectures": [ARCHITECTURES[self.model_type]], "model_type": self.model_type}
        d.update(COMMON_DEFAULTS)
        d.update(MIXER_DEFAULTS[self.model_type])
        unknown = set(self.config) - set(d) - self.LINEAGE_FIELDS.get(self.model_type, set())
        if unknown:
            raise ValueError(f"{self.model_type}/{self.name}: not fla config fields: {sorted(unknown)}")
        if self.minimal:
            return {"model_type": self.model_type, **self.config}
        d.update(self.config)
        d["torch_dtype"] = _HF_DTYPE_NAME[self.weights_dtype]
        return d


def _case(model_type, name, seed, weights_dtype="F32", minimal=False, T=70, **config):
    base = {"vocab_size": 256, "num_hidden_layers": 2}
    return FlaCase(model_type, name, {**base, **config}, seed=seed, T=T, weights_dtype=weights_dtype,
                   minimal=minimal)


CASES = [
    _case("linear_attn", "f32_elementwise_product", 2001, hidden_size=48, num_heads=4),
    _case("linear_attn", "f32_elu_normalized", 2002, vocab_size=211, hidden_size=32, num_heads=2,
          expand_v=2.0, feature_map="elu", norm_feature_map=True, intermediate_size=96,
          tie_word_embeddings=True, norm_eps=1e-5),
    # lineage's use_short_conv (fla's linear attention has none): the study's additive row.
    _case("linear_attn", "f32_elu_conv", 2010, vocab_size=211, hidden_size=32, num_heads=2, feature_map="elu",
          norm_feature_map=True, use_short_conv=True, intermediate_size=64),
    _case("linear_attn", "f32_relu_normqk_gqa", 2003, vocab_size=300, hidden_size=64, num_heads=4,
          num_kv_heads=2, expand_k=0.5, feature_map="relu", norm_q=True, norm_k=True,
          elementwise_affine=False, hidden_ratio=2),
    _case("delta_net", "f32", 2101, vocab_size=257, hidden_size=48, num_heads=4),
    _case("delta_net", "bf16", 2102, "BF16", hidden_size=64, num_heads=2, use_gate=True,
          allow_neg_eigval=True, conv_size=3, intermediate_size=160, tie_word_embeddings=True),
    _case("delta_net", "f32_elu_sum_nobeta", 2103, vocab_size=230, hidden_size=32, num_heads=2,
          qk_activation="elu", qk_norm="sum", use_beta=False, intermediate_size=64),
    _case("gated_deltanet", "f32_gva", 2201, hidden_size=48, num_heads=2, num_v_heads=4, head_dim=16,
          expand_v=1.5, use_gate=True),
    _case("gated_deltanet", "f32_nogate_negeig", 2202, vocab_size=240, hidden_size=32, num_heads=4,
          head_dim=8, expand_v=1.0, use_gate=False, allow_neg_eigval=True, intermediate_size=80),
    _case("kda", "f32", 2301, hidden_size=48, num_heads=4, head_dim=12),
    _case("kda", "f32_gva", 2302, vocab_size=270, hidden_size=64, num_heads=2, num_v_heads=4, head_dim=16,
          expand_v=1.5, intermediate_size=128),
    _case("kda", "bf16", 2303, "BF16", hidden_size=64, num_heads=2, head_dim=32, tie_word_embeddings=True),
    # Released heads' sizes (Kimi Linear: K = V = 128; fla's GatedDeltaNet: K = 256, V = 2K), where the
    # AVX-512 recurrent sweep splits a head's state columns into blocks, and K = 256 takes the chunked
    # kernel from 4 tokens on.
    _case("kda", "f32_head128", 2304, hidden_size=64, num_heads=2, head_dim=128, intermediate_size=128),
    _case("gated_deltanet", "f32_v128", 2203, hidden_size=64, num_heads=2, head_dim=64, expand_v=2.0,
          use_gate=True, intermediate_size=128),
    _case("gated_deltanet", "f32_head256", 2204, hidden_size=64, num_heads=1, head_dim=256, expand_v=2.0,
          use_gate=True, intermediate_size=128),
    # config.json with vocab_size, num_hidden_layers and hidden_size only: every other field takes fla's
    # defaults (heads, head dims, expand_k/v, conv, gates, feature map, MLP width rule, norm_eps 1e-6,
    # untied lm_head). fla's hidden_size default (2048) stays out of a test-sized case, and Gated DeltaNet's
    # default state (6 heads of 256 x 512) keeps its case to one layer and 40 tokens (three 16-token
    # chunks of the engine's chunked kernel, which K = 256 takes from 4 tokens on).
    _case("linear_attn", "f32_defaults", 2004, minimal=True, hidden_size=48),
    _case("delta_net", "f32_defaults", 2104, minimal=True, hidden_size=64),
    _case("gated_deltanet", "f32_defaults", 2205, minimal=True, T=40, num_hidden_layers=1, hidden_size=48),
    _case("kda", "f32_defaults", 2305, minimal=True, num_hidden_layers=1, hidden_size=48),
    # No short convolutions (use_short_conv false): q, k and v straight from their projections.
    _case("delta_net", "f32_noconv", 2105, vocab_size=230, hidden_size=32, num_heads=2, use_short_conv=False,
          intermediate_size=64),
    _case("gated_deltanet", "f32_noconv", 2206, vocab_size=240, hidden_size=32, num_heads=2, head_dim=16,
          expand_v=1.5, use_short_conv=False, intermediate_size=64),
    _case("kda", "f32_noconv", 2306, vocab_size=250, hidden_size=32, num_heads=2, head_dim=16,
          use_short_conv=False, intermediate_size=64),
    # fla's lower-bound gate (Kimi K3's): a = lower_bound * sigmoid(exp(A_log) (f + dt_bias)), in (-5, 0);
    # the heads with large exp(A_log) and channels with dt_bias near 2 decay by nearly e^-5 a step.
    _case("kda", "lower_bound", 2307, hidden_size=48, num_heads=4, head_dim=12, lower_bound=-5.0),
    # fla's Block AttnRes: attnres_block_size 4 sublayers = 2 layers per block over 3 layers, so layers 0 and 2
    # start blocks: layer 2's attention mixes [embedding, layers 0-1], its MLP and the output mix
    # [embedding, layers 0-1, layer 2's partial]. (More layers push the float32 self-check past its
    # tolerance, with or without AttnRes.)
    _case("kda", "attnres", 2308, hidden_size=48, num_heads=4, head_dim=12, intermediate_size=96,
          num_hidden_layers=3, attnres_block_size=4),
]

# Linear weights [out, in] ~ N(0, gain / sqrt(in)), keyed by the name after "attn." / "mlp.". Gains make
# the SiLU inputs after the short conv, the beta logits and the feature maps of std ~1.5-2, so no
# nonlinearity sits in its linear regime.
_MATRIX_GAIN = {
    "q_proj.weight": 1.5, "k_proj.weight": 1.5, "v_proj.weight": 1.5, "b_proj.weight": 2.0,
    "a_proj.weight": 1.5, "g_proj.weight": 1.5, "o_proj.weight": 1.0,
    "f_proj.0.weight": 1.0, "f_proj.1.weight": 1.5, "g_proj.0.weight": 1.0, "g_proj.1.weight": 1.5,
    "feature_map_q.layer1.weight": 1.0, "feature_map_q.layer2.weight": 1.0,
    "feature_map_k.layer1.weight": 1.0, "feature_map_k.layer2.weight": 1.0,
    "gate_proj.weight": 1.5, "up_proj.weight": 1.0, "down_proj.weight": 1.0, "lm_head.weight": 1.0,
}
# exp(A_log) per head spans mild to strong decay; with dt_bias below, per-token log decays a_t run from
# about -1e-3 (state kept for hundreds of tokens) to about -5 (state nearly wiped every token).
_A_RANGE = (0.02, 4.0)
# AttnRes pseudo-queries [1, D] ~ N(0, gain / sqrt(D)): logits of std ~1.5, so the mixes are far from uniform.
_RES_PROJ_GAIN = 1.5
_GDN_DT_BIAS_RANGE = (-4.0, 1.0)   # one per v-head, spread evenly, shuffled
_KDA_DT_BIAS_RANGE = (-5.0, 2.0)   # one per (v-head, key channel), uniform


def _spread(lo: float, hi: float, n: int, gen: torch.Generator, log: bool = False) -> torch.Tensor:
    """n values from lo to hi (evenly, or evenly in log space), in a seeded random order."""
    if n == 1:
        values = torch.tensor([math.sqrt(lo * hi) if log else (lo + hi) / 2])
    elif log:
        values = torch.exp(torch.linspace(math.log(lo), math.log(hi), n))
    else:
        values = torch.linspace(lo, hi, n)
    return values[torch.randperm(n, generator=gen)].to(torch.float32)


def init_params(cfg: FlaConfig, gen: torch.Generator) -> dict:
    """float32 parameters by checkpoint name: embeddings N(0, 1), Linear weights as _MATRIX_GAIN says,
    conv taps N(0, 1/W), norm weights 1 + N(0, 0.1), biases N(0, 0.5), AttnRes pseudo-queries
    N(0, 1.5 / sqrt(D)), A_log and dt_bias as above."""
    out = {}
    for name, shape, kind in tensor_specs(cfg):
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "embed":
            out[name] = noise
        elif kind == "norm_weight":
            out[name] = 1.0 + 0.1 * noise
        elif kind == "matrix":
            key = name if name == "lm_head.weight" else name.split(".attn.")[-1].split(".mlp.")[-1]
            out[name] = (_MATRIX_GAIN[key] / math.sqrt(shape[-1])) * noise
        elif kind == "res_proj":
            out[name] = (_RES_PROJ_GAIN / math.sqrt(shape[-1])) * noise
        elif kind == "conv":
            out[name] = noise / math.sqrt(shape[-1])
        elif kind == "bias":
            out[name] = 0.5 * noise
        elif kind == "A_log":
            out[name] = torch.log(_spread(*_A_RANGE, shape[0], gen, log=True))
        elif kind == "dt_bias" and cfg.model_type == "gated_deltanet":
            out[name] = _spread(*_GDN_DT_BIAS_RANGE, shape[0], gen)
        elif kind == "dt_bias":
            lo, hi = _KDA_DT_BIAS_RANGE
            out[name] = lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float32)
        else:
            raise AssertionError(f"init_params: no rule for {name} ({kind})")
    return out


def checkpoint_tensors(case: FlaCase, params: dict) -> dict:
    """Parameters rounded to the case's weights dtype, except A_log and dt_bias (always F32)."""
    dtype = _TORCH_DTYPE[case.weights_dtype]
    return {name: t if name.endswith(_ALWAYS_F32) else t.to(dtype) for name, t in params.items()}


def write_model_dir(case: FlaCase, case_dir: str, tensors: dict) -> None:
    """config.json (indent 2, fla's field order) and model.safetensors."""
    golden_io.write_model_dir(case_dir, case.json_config(), tensors)


def self_check(case: FlaCase, cfg: FlaConfig, tensors: dict, tokens: torch.Tensor, rec64: dict) -> dict:
    """Raises unless the recorded names and shapes are the contract, float32 agrees with float64 on
    every intermediate, the logits are causal, and a two-part feed (carrying S and the conv tails)
    reproduces the one-shot states and logits. Returns {name: {"f32_torch_rel_rms": err}}."""
    label = f"{case.model_type}/{case.name}"
    check_contract(label, rec64, intermediate_shapes(cfg, case.T))
    rec32 = {}
    fla_forward(cfg, canonical_weights(cfg, tensors, torch.float32), tokens, rec32)
    errors, _ = f32_errors(label, rec32, rec64, F32_SELF_CHECK_TOL)
    half = case.T // 2
    w64 = canonical_weights(cfg, tensors, torch.float64)
    check_causal(label, fla_forward(cfg, w64, tokens[:half]), rec64["logits"], EXACT_TOL)
    cache = initial_cache(cfg, torch.float64)
    fla_forward(cfg, w64, tokens[:half], cache=cache)
    second = fla_forward(cfg, w64, tokens[half:], cache=cache)
    checks = [("logits of the second part", second, rec64["logits"][half:])]
    checks += [(f"layer {i} state", cache[i]["S"], rec64[f"h{i}.attn.state"])
               for i in range(cfg.num_hidden_layers)]
    check_split(label, checks, half, case.T, EXACT_TOL)
    return f32_manifest_entries(errors)


def _gate_ranges(rec: dict) -> str:
    """Summary of how hard the gates are driven: beta and exp(a_t) over all layers."""
    parts = []
    for key, label, fn in (("attn.beta", "beta", lambda t: t), ("attn.log_decay", "exp(a)", torch.exp)):
        values = [fn(t) for name, t in rec.items() if name.endswith(key)]
        if values:
            lo, hi = min(float(v.min()) for v in values), max(float(v.max()) for v in values)
            parts.append(f"{label} {lo:.2g}..{hi:.2g}")
    return (", " + ", ".join(parts)) if parts else ""


def build_case(case: FlaCase, case_dir: str) -> str:
    """Writes case_dir (HF model directory) and case_dir/golden/. Returns a one-line summary."""
    cfg = FlaConfig.from_json(case.json_config())
    gen = torch.Generator().manual_seed(case.seed)
    write_model_dir(case, case_dir, checkpoint_tensors(case, init_params(cfg, gen)))
    config, tensors = read_model_dir(case_dir)
    cfg = FlaConfig.from_json(config)  # the reference runs on exactly what the C++ side will read
    tokens_np = case_tokens(case, cfg)
    tokens = torch.from_numpy(tokens_np).long()
    rec64 = {}
    fla_forward(cfg, canonical_weights(cfg, tensors, torch.float64), tokens, rec64)
    per_name = self_check(case, cfg, tensors, tokens, rec64)
    manifest = manifest_head(case.model_type, case,
                             state_layout="attn.state is the final recurrent state S per value head, [HV, K, V]")
    golden_dir = os.path.join(case_dir, "golden")
    write_golden(golden_dir, tokens_np, rec64, manifest, per_name)
    worst = max(v["f32_torch_rel_rms"] for v in per_name.values())
    w64, bf16 = canonical_weights(cfg, tensors, torch.float64), bf16_weight_names(tensors)
    dot = bf16_dot_golden(golden_dir, f"{case.model_type}/{case.name}", case.weights_dtype,
                          lambda t: fla_forward(cfg, w64, t, bf16_inputs=bf16), tokens, rec64["logits"])
    return (f"{case.weights_dtype} L={cfg.num_hidden_layers} D={cfg.hidden_size} H={cfg.num_heads} "
            f"HV={cfg.v_heads} K={cfg.head_k_dim} V={cfg.head_v_dim} F={cfg.mlp_width} "
            f"vocab={cfg.vocab_size} T={case.T}{_gate_ranges(rec64)}; {len(tensors)} tensors, "
            f"{len(rec64)} intermediates, f32 self-check {worst:.1e}{dot}")


# One make_goldens.py family per model type: DIR/<model_type>/<case>/.
FAMILIES = [(t, FamilyCases([c for c in CASES if c.model_type == t], build_case)) for t in MODEL_TYPES]
