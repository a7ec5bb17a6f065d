"""Gradient goldens for the engine's training backward passes: for each F32 case listed in GRAD_CASES (a list
per family, each case with its own token seed), DIR/<family>/<case>/grad/ holds tokens.npy (int32
[B, T + 1]), one float32 .npy per parameter tensor of the checkpoint with d loss / d tensor from torch autograd
in float64 (stored name and shape; a tied embedding's gradient includes the head's share), and manifest.json
(the loss, float32 PyTorch's own loss, and per tensor f32_torch_rel_rms = ||g32 - g64|| / ||g64|| of
PyTorch's float32 autograd gradient).

loss = (1 / (B T)) sum_b sum_{t < T} CE(logits(tokens[b, :T])[t], tokens[b, t + 1]): every sequence runs
alone from an empty state / empty cache through the family's own full-sequence forward (gpt2.gpt2_forward,
delta_family.fla_forward, kimi_linear.kimi_forward, kimi_k3.k3_forward, qwen.qwen_forward; their token mixers
as the forward goldens run them: the token-by-token recurrence for the delta rule and Qwen's Gated DeltaNet,
the explicit MLA form, Qwen's explicit causal softmax attention), called here, not copied. Tensors that get no
gradient by design (mask buffers, the router's e_score_correction_bias, packed integer tensors, tensors the
text model skips: vision, Qwen's mtp.* head) are listed under "no_grad" with the reason, and every other
tensor must get one.

make_goldens.py calls build_grad(family, case_dir, grad_case) after it has written a case named in
GRAD_CASES (find_grad_case); the gradients run on exactly what it wrote (config.json and the checkpoint read
back)."""

import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

import delta_family
import gpt2
import kimi_k3
import kimi_linear
import qwen
import qwen_goldens
from golden_io import METRIC, read_model_dir, relative_rms, write_array
from kimi_linear_goldens import check_routing

GRAD_DIR = "grad"
B = 2            # sequences, each run alone from an empty state
T = 20           # inputs per sequence: past one 16-token chunk of the delta rule (16 + 4)
# PyTorch's float32 gradients must agree with float64 this well on every tensor (a sanity bound: the C++
# test sets its tolerances from the per-tensor f32_torch_rel_rms).
F32_GRAD_TOL = 1e-3

_RECURRENT = ("recurrent: delta_family.gated_delta_recurrent, the token-by-token recurrence of spec 1.5 "
              "(the reference has no chunked model path; test_reference.py checks that autograd through the "
              "chunked form of spec 1.6 gives the same gradients)")
_QWEN_FORM = ("Gated DeltaNet recurrent: qwen.gdn_recurrent, the token-by-token gated delta rule of spec 3.4 "
              "(value head j reads key head j // r; no chunked form); gated attention explicit (full causal "
              "softmax, K and V expanded to the query heads); qwen.qwen_forward")
_QWEN_MOE = ("; MoE as a loop over the selected experts (the top-k selection takes no gradient, the chosen "
             "experts' softmax weights do, renormalized)")
_FORMS = {
    "gpt2": "full-sequence causal softmax attention (gpt2.gpt2_forward)",
    "linear_attn": _RECURRENT + "; the normaliser's running key sum as a cumulative sum",
    "delta_net": _RECURRENT,
    "gated_deltanet": _RECURRENT,
    "kda": _RECURRENT,
    "kimi_linear": "KDA " + _RECURRENT + "; MLA explicit (K and V expanded, full causal softmax)",
    "kimi_k3": "KDA " + _RECURRENT + "; MLA explicit (K and V expanded, full causal softmax)",
    "qwen3_next": _QWEN_FORM + _QWEN_MOE + " (per-expert tensors)",
    "qwen3_5": _QWEN_FORM + "; dense SwiGLU MLPs",
    "qwen3_5_moe": _QWEN_FORM + _QWEN_MOE + " (the fused gate_up_proj / down_proj sliced per expert)",
}


@dataclass(frozen=True)
class GradCase:
    case: str    # the forward-golden case whose checkpoint the gradients are taken on
    seed: int    # tokens: np.random.RandomState(seed).randint(0, vocab, (B, T + 1))


# F32 cases per family (no MXFP4 tensors), each a list: first the one with the most features that is still
# tiny (the case test_reference.py's chunked and finite-difference gradient tests use), then any more that
# cover what the first does not (kda's lower_bound: a plain-residual KDA case the engine can train while its
# attnres is beyond it). Every seed is unique.
GRAD_CASES = {
    "gpt2": [GradCase("f32_tanh", 9001),                    # tied wte (embedding + head), mask buffers, gelu_new
             GradCase("f32_conv", 9009)],                   # lineage's study extension: q | k | v + short conv
    "linear_attn": [GradCase("f32_elu_normalized", 9002),   # elu feature map, normaliser, tied, expand_v 2
                    GradCase("f32_elu_conv", 9010)],        # lineage's short conv (no activation after it)
    "delta_net": [GradCase("f32", 9003)],                   # short convs, silu, l2 norm, beta
    "gated_deltanet": [GradCase("f32_gva", 9004)],          # GVA (HV = 2H), output gate, per-head decay
    "kda": [GradCase("attnres", 9005),                      # per-channel decay, fla Block AttnRes over 3 layers
            GradCase("lower_bound", 9008)],                 # plain residual, fla's lower-bound gate (in (-5, 0))
    "kimi_linear": [GradCase("f32", 9006)],                 # KDA + MLA, dense + MoE (8 experts, k 2, shared)
    "kimi_k3": [GradCase("text_only", 9007)],               # K3 without MXFP4: q-LoRA gated MLA, lower-bound
                                                            # KDA, latent MoE, Block AttnRes, SiTU
    "qwen3_next": [GradCase("f32_sharded", 9011)],          # interleaved in_proj_qkvz / _ba, GVA r 2, gated
                                                            # attention, MoE (8 experts, k 2, per-expert, shared)
    "qwen3_5": [GradCase("f32", 9012)],                     # flat in_proj_qkv / _z / _b / _a, tied, dense MLP
    "qwen3_5_moe": [GradCase("f32", 9013)],                 # fused experts gate_up_proj [E, 2I, D] / down_proj
}


def find_grad_case(family: str, case: str) -> Optional[GradCase]:
    """The GradCase of GRAD_CASES[family] named case, or None."""
    return next((g for g in GRAD_CASES.get(family, []) if g.case == case), None)

_BY_DESIGN = {
    "buffer": "causal-mask buffer (HF GPT2Attention bias / masked_bias), not a parameter",
    "router_bias": ("router e_score_correction_bias: it only shifts the top-k selection, which is not "
                    "differentiable, and is not trained by gradient; the router's gate.weight gets its "
                    "gradient through the selected experts' weights"),
    "packed": "integer tensor (MXFP4 weight_packed / weight_scale codes): not differentiable",
    "vision": "vision tower / projector: not part of the text model's loss",
    "mtp": "multi-token-prediction head (mtp.*): not part of the next-token loss, the text model skips it",
    "first_mix": ("layer 0's pre-attention AttnRes mix: never evaluated (no sources yet, the layer's input is "
                  "the embedding itself), so the loss does not depend on it"),
}


@dataclass(frozen=True)
class Model:
    """A written case as the gradient code runs it: forward(w, tokens [T], routing) -> logits [T, vocab] with
    w = canonical(stored tensors, dtype); no_grad(name, tensor) -> a _BY_DESIGN key or None; MoE families:
    routing_margin(label, one sequence's [(layer, Routing)]) -> the smallest top-k margin, raising where the
    family's golden margins or expert coverage fail."""
    family: str
    vocab_size: int
    canonical: Callable
    forward: Callable
    no_grad: Callable
    moe_cfg: Optional[object] = None           # the config, for MoE families (routing checks)
    routing_margin: Optional[Callable] = None  # MoE families


def _common_no_grad(name: str, t: torch.Tensor) -> Optional[str]:
    if not t.is_floating_point():
        return "packed"
    if name.endswith("e_score_correction_bias"):
        return "router_bias"
    return None


def _kimi_margin(cfg) -> Callable:
    """routing_margin by kimi_linear_goldens.check_routing (kimi_linear, kimi_k3)."""
    return lambda label, routing: check_routing(label, cfg, routing)["expert_margin"]


def _qwen_margin(cfg: qwen.QwenConfig) -> Callable:
    """routing_margin by qwen_goldens.routing_problem (the Qwen goldens' margins and expert coverage)."""
    def margin(label: str, routing: list) -> float:
        problem = qwen_goldens.routing_problem(cfg, routing)
        if problem:
            raise AssertionError(f"{label}: {problem}")
        return qwen_goldens.min_margin(routing)
    return margin


def _qwen_model(family: str, config: dict) -> Model:
    """A Qwen family's Model: qwen.qwen_forward on the text tensors; mtp.* and model.visual.* get no gradient."""
    cfg = qwen.QwenConfig.from_json(config)
    if cfg.family != family:
        raise ValueError(f"grad: config.json model_type {cfg.family!r} in family {family}")

    def no_grad(name, t):
        if name.startswith("mtp."):
            return "mtp"
        if name.startswith(qwen.SKIPPED_PREFIXES[family]):
            return "vision"
        return _common_no_grad(name, t)
    moe = cfg.num_experts > 0
    return Model(family, cfg.vocab_size, lambda ts, dt: qwen.canonical_weights(cfg, ts, dt),
                 lambda w, tok, routing: qwen.qwen_forward(cfg, w, tok, routing=routing), no_grad,
                 cfg if moe else None, _qwen_margin(cfg) if moe else None)


def make_model(family: str, config: dict) -> Model:
    """The Model of a family from its config.json (dict)."""
    if family == "gpt2":
        cfg = gpt2.GPT2Config.from_json(config)

        def no_grad(name, t):
            return "buffer" if gpt2._BUFFER.match(gpt2._bare(name)) else _common_no_grad(name, t)
        return Model(family, cfg.vocab_size, lambda ts, dt: gpt2.canonical_weights(cfg, ts, dt),
                     lambda w, tok, routing: gpt2.gpt2_forward(cfg, w, tok), no_grad)
    if family in delta_family.MODEL_TYPES:
        cfg = delta_family.FlaConfig.from_json(config)
        if cfg.model_type != family:
            raise ValueError(f"grad: config.json model_type {cfg.model_type!r} in family {family}")

        def no_grad(name, t):
            first_mix = cfg.attnres_block_size is not None and name.startswith("model.layers.0.attn_res_")
            return "first_mix" if first_mix else _common_no_grad(name, t)
        return Model(family, cfg.vocab_size, lambda ts, dt: delta_family.canonical_weights(cfg, ts, dt),
                     lambda w, tok, routing: delta_family.fla_forward(cfg, w, tok), no_grad)
    if family == "kimi_linear":
        cfg = kimi_linear.KimiConfig.from_json(config)
        return Model(family, cfg.vocab_size, lambda ts, dt: kimi_linear.canonical_weights(cfg, ts, dt),
                     lambda w, tok, routing: kimi_linear.kimi_forward(cfg, w, tok, routing=routing),
                     _common_no_grad, cfg, _kimi_margin(cfg))
    if family == "kimi_k3":
        cfg = kimi_k3.K3Config.from_json(config)

        def no_grad(name, t):
            if cfg.tensor_prefix and name.startswith(kimi_k3.SKIPPED_PREFIXES):
                return "vision"
            if name.startswith(cfg.tensor_prefix + "model.layers.0.self_attention_res_"):
                return "first_mix"
            return _common_no_grad(name, t)
        return Model(family, cfg.vocab_size, lambda ts, dt: kimi_k3.canonical_weights(cfg, ts, dt),
                     lambda w, tok, routing: kimi_k3.k3_forward(cfg, w, tok, routing=routing), no_grad, cfg,
                     _kimi_margin(cfg))
    if family in qwen.FAMILIES:
        return _qwen_model(family, config)
    raise ValueError(f"grad: unknown family {family!r}")


def load_case(family: str, case_dir: str) -> tuple:
    """(Model, stored tensors) of a written case directory."""
    config, tensors = read_model_dir(case_dir)
    return make_model(family, config), tensors


def grad_tokens(model: Model, seed: int, batch: int = B, length: int = T) -> np.ndarray:
    """int32 [batch, length + 1], seeded, ids < vocab: inputs [:, :length], targets [:, 1:]."""
    return np.random.RandomState(seed).randint(0, model.vocab_size, size=(batch, length + 1)).astype(np.int32)


def loss_fn(model: Model, tensors: dict, tokens: torch.Tensor, routing: Optional[list] = None) -> torch.Tensor:
    """The mean next-token cross-entropy over the B*T positions, every sequence from an empty state, in the
    dtype of tensors' floating-point entries (stored names, differentiable). routing, a list, receives one
    list of (layer, Routing) per sequence."""
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) != 1:
        raise ValueError(f"grad: the loss runs in one dtype, got tensors in {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    w = model.canonical(tensors, dtype)
    total = 0.0
    for b in range(tokens.shape[0]):
        seq_routing = []
        logits = model.forward(w, tokens[b, :-1], seq_routing)
        total = total + F.cross_entropy(logits, tokens[b, 1:], reduction="sum")
        if routing is not None:
            routing.append(seq_routing)
    return total / tokens[:, 1:].numel()


def loss_and_grads(model: Model, stored: dict, tokens: torch.Tensor, dtype: torch.dtype) -> tuple:
    """(loss, {name: gradient or None}, routing) with every floating-point stored tensor a leaf in dtype;
    integer tensors go in as stored and get no entry."""
    leaves = {n: t.detach().to(dtype).requires_grad_() if t.is_floating_point() else t for n, t in stored.items()}
    routing = []
    loss = loss_fn(model, leaves, tokens, routing)
    names = [n for n, t in leaves.items() if t.requires_grad]
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    return loss.detach(), dict(zip(names, grads)), routing


def _check_routing(label: str, model: Model, routing64: list, routing32: list) -> str:
    """MoE families: every sequence's selections keep the family's golden margins (model.routing_margin),
    float32 selects the same experts, and every expert of every MoE layer is used in the batch (so each one
    gets a gradient)."""
    if model.moe_cfg is None:
        return ""
    notes = []
    for b, (seq64, seq32) in enumerate(zip(routing64, routing32)):
        notes.append(model.routing_margin(f"{label} sequence {b}", seq64))
        for (layer, sel64), (_, sel32) in zip(seq64, seq32):
            if not torch.equal(sel64.ids, sel32.ids):
                raise AssertionError(f"{label}: sequence {b} layer {layer}: float32 selects other experts")
    for layer_runs in zip(*routing64):
        used = set().union(*(set(sel.ids.flatten().tolist()) for _, sel in layer_runs))
        if len(used) != model.moe_cfg.num_experts:
            raise AssertionError(f"{label}: layer {layer_runs[0][0]} leaves experts "
                                 f"{sorted(set(range(model.moe_cfg.num_experts)) - used)} unused")
    return f", expert margin {min(notes):.1e}"


def compute(family: str, case_dir: str, grad_case: GradCase) -> dict:
    """Everything build_grad writes, without writing it: tokens, loss (float64 and float32), the float64
    gradients by stored name, their f32_torch_rel_rms, the no-grad tensors and notes. Raises unless exactly
    the by-design tensors lack a gradient, float32 agrees within F32_GRAD_TOL, and (MoE) the routing holds."""
    label = f"{family}/{grad_case.case} grad"
    model, stored = load_case(family, case_dir)
    tokens_np = grad_tokens(model, grad_case.seed)
    tokens = torch.from_numpy(tokens_np).long()
    loss64, g64, routing64 = loss_and_grads(model, stored, tokens, torch.float64)
    loss32, g32, routing32 = loss_and_grads(model, stored, tokens, torch.float32)
    notes = _check_routing(label, model, routing64, routing32)
    grads, no_grad, errors = {}, [], {}
    for name, t in stored.items():
        reason = model.no_grad(name, t)
        g = g64.get(name)
        if reason is not None:
            if g is not None:
                raise AssertionError(f"{label}: '{name}' ({reason}) unexpectedly gets a gradient")
            no_grad.append({"name": name, "shape": list(t.shape), "reason": _BY_DESIGN[reason]})
            continue
        if g is None:
            raise AssertionError(f"{label}: '{name}' gets no gradient")
        if not bool(torch.isfinite(g).all()) or not bool((g != 0).any()):
            raise AssertionError(f"{label}: '{name}' has a non-finite or all-zero gradient")
        grads[name] = g
        errors[name] = relative_rms(g32[name], g)
    worst = max(errors, key=errors.get)
    if errors[worst] > F32_GRAD_TOL:
        raise AssertionError(f"{label}: float32 gradient of '{worst}' lies {errors[worst]:.3g} relative RMS from "
                             f"float64 (> {F32_GRAD_TOL})")
    return {"case": grad_case.case, "tokens": tokens_np, "loss": float(loss64), "loss_f32_torch": float(loss32),
            "grads": grads, "f32_errors": errors, "no_grad": no_grad, "worst": worst, "notes": notes}


def build_grad(family: str, case_dir: str, grad_case: GradCase) -> str:
    """Writes case_dir/grad/ for grad_case, one of GRAD_CASES[family] (case_dir, its case, already written).
    Returns a summary."""
    r = compute(family, case_dir, grad_case)
    grad_dir = os.path.join(case_dir, GRAD_DIR)
    os.makedirs(grad_dir, exist_ok=True)
    np.save(os.path.join(grad_dir, "tokens.npy"), np.ascontiguousarray(r["tokens"], dtype="<i4"))
    entries = []
    for name, g in r["grads"].items():
        file, shape = write_array(grad_dir, name.replace("/", "_"), g)
        entries.append({"name": name, "file": file, "shape": shape, "dtype": "float32",
                        "f32_torch_rel_rms": float(f"{r['f32_errors'][name]:.3e}")})
    manifest = {
        "model": family,
        "case": r["case"],
        "B": B,
        "T": T,
        "loss": r["loss"],
        "loss_f32_torch": r["loss_f32_torch"],
        "loss_definition": ("mean over b < B, t < T of cross_entropy(logits(tokens[b, :T])[t], tokens[b, t + 1]); "
                            "each sequence run alone from an empty state / empty cache"),
        "forward": _FORMS[family],
        "compute_dtype": "float64",
        "metric": METRIC,
        "gradients": "d loss / d tensor in the tensor's stored name and shape, float32 (computed in float64)",
    }
    token_entry = {"file": "tokens.npy", "shape": list(r["tokens"].shape), "dtype": "int32"}
    head = json.dumps(manifest, indent=2)[:-2] + f',\n  "tokens": {json.dumps(token_entry)}'
    tensors = ",\n".join("    " + json.dumps(e) for e in entries)
    no_grad = ",\n".join("    " + json.dumps(e) for e in r["no_grad"])
    no_grad = f"\n{no_grad}\n  " if no_grad else ""
    with open(os.path.join(grad_dir, "manifest.json"), "w") as f:
        f.write(f'{head},\n  "tensors": [\n{tensors}\n  ],\n  "no_grad": [{no_grad}]\n}}\n')
    worst = r["worst"]
    return (f"B={B} T={T} loss {r['loss']:.6f} (f32 {r['loss_f32_torch']:.6f}), {len(entries)} gradients, "
            f"{len(r['no_grad'])} without, f32 gradients worst {r['f32_errors'][worst]:.1e} ({worst}){r['notes']}")
