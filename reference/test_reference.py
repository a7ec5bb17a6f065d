"""Checks of the reference itself: safetensors round trips, gpt2.py against an independent token-by-token
KV-cache decode built from torch.nn.functional, delta_family.py's building blocks against torch.nn.functional
and its recurrence against the chunked (WY) form of spec 1.6, decode against prefill for every delta-family
case (BF16 cases with the bf16 dot-product emulation too), its fla Block AttnRes against the paper's block
formulation in sublayer units, kimi_linear.py's decode (explicit and absorbed
MLA) against its prefill, its KDA against delta_family's, its RoPE, MLA and MoE router against independent
forms; kimi_k3.py's decode against its prefill, its Block AttnRes against the paper's block formulation
with folded pseudo-queries, its MXFP4 decode against E2M1's bit fields, its lower-bound KDA against
delta_family's, its -inf group mask, its latent MoE against a per-token loop, the published configs and
K3's parameter count; qwen.py against an independent HF-shaped token-by-token decode (every Qwen case, bf16
inputs too), its GDN recurrence against the chunked form, Qwen3-Next against its Qwen3.5-MoE twin layout,
and its config parsing; the gradient goldens (grad_goldens.py: autograd through the chunked form equals
autograd through the recurrence, autograd equals finite differences, the grad/ layout); bench_train.py's
PyTorch baseline (fla's naive chunked mixers, batched layers) against delta_family's recurrence; and
bit-identical golden re-runs.
Run: /usr/bin/python3 reference/test_reference.py   (also collectable by pytest)"""

import dataclasses
import filecmp
import math
import os
import struct
import subprocess
import sys
import tempfile
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_train  # noqa: E402
import delta_family  # noqa: E402
import delta_family_goldens  # noqa: E402
import grad_goldens  # noqa: E402
import kimi_k3  # noqa: E402
import kimi_k3_goldens  # noqa: E402
import kimi_linear  # noqa: E402
import kimi_linear_goldens  # noqa: E402
import make_goldens  # noqa: E402
import qwen  # noqa: E402
import qwen_goldens  # noqa: E402
from golden_io import case_tokens, relative_rms  # noqa: E402
from gpt2 import bf16_weight_names, canonical_weights, gpt2_forward  # noqa: E402
from gpt2_goldens import CASES, checkpoint_tensors, init_params  # noqa: E402
from safetensors_io import read_checkpoint, read_header, read_safetensors, write_safetensors, write_sharded  # noqa: E402


def _cached_decode(forward, cache, cfg, w, tokens, **kwargs):
    """forward(cfg, w, ...) fed tokens one at a time through cache (updated in place): the logits [T, vocab]."""
    return torch.cat([forward(cfg, w, tokens[t:t + 1], cache=cache, **kwargs) for t in range(tokens.shape[0])])


def _folded_mix(w, sources, prefix, eps):
    """One AttnRes mix written independently of the references: keys RMS-normalized with the folded
    pseudo-query norm.weight * proj.weight[0], softmax over the sources, the raw sources summed."""
    fold = w[prefix + "_norm.weight"] * w[prefix + "_proj.weight"][0]
    s = torch.stack(sources, dim=1)                                           # [T, S, D]
    z = (s * fold).sum(-1) / torch.sqrt(s.pow(2).mean(-1) + eps)
    p = F.softmax(z, dim=1)
    return torch.einsum("ts,tsd->td", p, s), p

def test_safetensors_round_trip():
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.f32": torch.randn(3, 5, generator=gen),
        "b.bf16": torch.randn(7, generator=gen).to(torch.bfloat16),
        "c.f16": torch.randn(2, 3, generator=gen).to(torch.float16),
        "d.bool": torch.tensor([[True, False, True]]),
        "e.u8": torch.arange(5, dtype=torch.uint8),
        "f.i64": torch.tensor([-1, 2**40], dtype=torch.int64),
        "g.scalar": torch.tensor(-1e4),
        "h.empty": torch.zeros(0, 4),
    }
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.safetensors")
        write_safetensors(path, tensors, {"format": "pt"})
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
        assert n % 8 == 0
        assert read_header(path)["__metadata__"] == {"format": "pt"}
        back = read_safetensors(path)
        assert set(back) == set(tensors)
        for name, t in tensors.items():
            assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
            assert torch.equal(back[name], t), name
        write_sharded(d, tensors, 3)
        back = read_checkpoint(d)
        assert all(torch.equal(back[n], t) for n, t in tensors.items())


def _decode_reference(cfg, w, tokens, bf16_inputs=frozenset()):
    """Independent GPT-2: one token at a time with a KV cache, F.layer_norm, F.gelu, F.linear; the
    input of a linear whose weight is in bf16_inputs is rounded to bf16 first."""
    D, H, hd = cfg.n_embd, cfg.n_head, cfg.head_dim

    def linear(x, name, bias=None, out_in=False):  # Conv1D weights are [in, out], the head [out, in]
        x = x.to(torch.bfloat16).to(x.dtype) if name in bf16_inputs else x
        return F.linear(x, w[name] if out_in else w[name].T, bias)

    approximate = "tanh" if cfg.activation_function == "gelu_new" else "none"
    cache = [([], []) for _ in range(cfg.n_layer)]
    raws = [[torch.zeros(3 * D, dtype=w["wte.weight"].dtype)] * (cfg.conv_size - 1) for _ in range(cfg.n_layer)]
    rows = []
    for pos, tok in enumerate(tokens.tolist()):
        x = w["wte.weight"][tok] + w["wpe.weight"][pos]
        for i in range(cfg.n_layer):
            p = f"h.{i}."
            a = F.layer_norm(x, (D,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.layer_norm_epsilon)
            qkv = linear(a, p + "attn.c_attn.weight", w[p + "attn.c_attn.bias"])
            if cfg.conv_size:  # lineage's short conv: F.conv1d over the last conv_size raw rows, plus the row
                window = torch.stack(raws[i][len(raws[i]) - cfg.conv_size + 1:] + [qkv], 1)  # [3D, conv_size]
                raws[i].append(qkv)
                qkv = qkv + F.conv1d(window[None], w[p + "attn.c_attn_conv1d.weight"], groups=3 * D)[0, :, 0]
            q, k, v = qkv.view(3, H, hd)
            cache[i][0].append(k)
            cache[i][1].append(v)
            keys, values = torch.stack(cache[i][0], 1), torch.stack(cache[i][1], 1)  # [H, pos+1, hd]
            scores = torch.einsum("hd,hsd->hs", q, keys) / math.sqrt(hd)
            ctx = torch.einsum("hs,hsd->hd", scores.softmax(-1), values).reshape(D)
            x = x + linear(ctx, p + "attn.c_proj.weight", w[p + "attn.c_proj.bias"])
            m = F.layer_norm(x, (D,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], cfg.layer_norm_epsilon)
            u = F.gelu(linear(m, p + "mlp.c_fc.weight", w[p + "mlp.c_fc.bias"]), approximate=approximate)
            x = x + linear(u, p + "mlp.c_proj.weight", w[p + "mlp.c_proj.bias"])
        y = F.layer_norm(x, (D,), w["ln_f.weight"], w["ln_f.bias"], cfg.layer_norm_epsilon)
        rows.append(linear(y, "lm_head.weight" if "lm_head.weight" in w else "wte.weight", out_in=True))
    return torch.stack(rows)


def test_gpt2_matches_independent_decode():
    for case in CASES:
        cfg = case.config
        tensors = checkpoint_tensors(case, init_params(cfg, torch.Generator().manual_seed(case.seed)))
        w = canonical_weights(cfg, tensors, torch.float64)
        tokens = torch.from_numpy(case_tokens(case, cfg)).long()
        err = relative_rms(_decode_reference(cfg, w, tokens), gpt2_forward(cfg, w, tokens))
        assert err < 1e-12, f"{case.name}: prefill vs decode relative RMS {err:.3g}"
        bf16 = bf16_weight_names(tensors)
        if bf16:  # the bf16 dot-product emulation: rounding is per token, so decode still equals prefill
            prefill = gpt2_forward(cfg, w, tokens, bf16_inputs=bf16)
            err = relative_rms(_decode_reference(cfg, w, tokens, bf16), prefill)
            assert err < 1e-12, f"{case.name}: bf16 inputs: prefill vs decode relative RMS {err:.3g}"


def test_short_conv_matches_conv1d():
    gen = torch.Generator().manual_seed(1)
    for W in (1, 3, 4):
        x = torch.randn(9, 5, generator=gen, dtype=torch.float64)
        weight = torch.randn(5, 1, W, generator=gen, dtype=torch.float64)
        ref = F.conv1d(x.T[None], weight, padding=W - 1, groups=5)[0, :, :9].T
        y, tail = delta_family.short_conv(x, weight, torch.zeros(W - 1, 5, dtype=torch.float64), activate=True)
        assert relative_rms(y, F.silu(ref)) < 1e-14, W
        assert torch.equal(tail, x[9 - (W - 1):]), W


def test_softplus_matches_torch():
    x = torch.linspace(-40, 60, 1001, dtype=torch.float64)
    assert torch.allclose(delta_family.softplus(x), F.softplus(x, beta=1, threshold=20), rtol=1e-15, atol=0)


def _chunked_gated_delta(q, k, v, beta, log_decay, S, C):
    """Spec 1.6 per v-head and chunk: X = (I + N)^-1, W = X diag(beta)(K * e^G), U = X diag(beta) V,
    Vn = U - W S, O = (Q * e^G) S + P Vn, S <- e^G_last * S + (K * e^(G_last - G))^T Vn. Inputs as
    delta_family.gated_delta_recurrent (log_decay [T, HV, K] here; beta None = plain additive write).
    No in-place writes, so autograd runs through it (test_chunked_gradients_match_recurrent)."""
    T, HV, K = q.shape
    outputs, states = [], []
    for h in range(HV):
        state, chunks = S[h], []
        for start in range(0, T, C):
            sl = slice(start, min(start + C, T))
            Q, Kc, Vc, A = q[sl, h], k[sl, h], v[sl, h], log_decay[sl, h]
            n = Q.shape[0]
            b = beta[sl, h] if beta is not None else None
            G = A.cumsum(0)                                            # [n, K] chunk-local
            diff = G[:, None, :] - G[None, :, :]                       # [i, j, K]: G_i - G_j
            lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
            decay = torch.where(lower[:, :, None], diff, torch.full_like(diff, -math.inf)).exp()
            kk = torch.einsum("id,jd,ijd->ij", Kc, Kc, decay)
            P = torch.einsum("id,jd,ijd->ij", Q, Kc, decay)            # inclusive diagonal
            if b is None:
                Vn = Vc
            else:
                N = b[:, None] * torch.tril(kk, diagonal=-1)
                X = torch.linalg.inv(torch.eye(n, dtype=q.dtype) + N)
                Wf = X @ (b[:, None] * Kc * G.exp())
                Vn = X @ (b[:, None] * Vc) - Wf @ state
            chunks.append((Q * G.exp()) @ state + P @ Vn)
            state = G[-1].exp()[:, None] * state + (Kc * (G[-1] - G).exp()).T @ Vn
        outputs.append(torch.cat(chunks))
        states.append(state)
    return torch.stack(outputs, dim=1), torch.stack(states)


def test_recurrence_matches_chunked_form():
    gen = torch.Generator().manual_seed(2)
    T, HV, K, V = 45, 3, 6, 5
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    q = delta_family.l2_normalize(rand(T, HV, K)) * K ** -0.5
    k = delta_family.l2_normalize(rand(T, HV, K))
    v, S0 = rand(T, HV, V), rand(HV, K, V)
    beta = 2 * torch.sigmoid(rand(T, HV))
    channel = -torch.exp(rand(T, HV, K))                               # KDA: per channel, down to ~ -30
    gates = {"delta": torch.zeros(T, HV), "gdn": -F.softplus(rand(T, HV)), "kda": channel}
    for name, a in gates.items():
        a = a.double()
        per_channel = a if a.dim() == 3 else a[:, :, None].expand(T, HV, K)
        for b in (beta, None):
            want_o, want_S = delta_family.gated_delta_recurrent(q, k, v, b, a, S0)
            got_o, got_S = _chunked_gated_delta(q, k, v, b, per_channel, S0, C=16)
            err = max(relative_rms(got_o, want_o), relative_rms(got_S, want_S))
            assert err < 1e-12, f"{name} beta={'none' if b is None else 'on'}: chunked vs recurrent {err:.3g}"


def _chunked_as_recurrent(calls: list):
    """delta_family.gated_delta_recurrent's signature on the chunked form (chunks of 16); appends T to calls."""
    def run(q, k, v, beta, log_decay, S):
        calls.append(q.shape[0])
        T, HV, K = q.shape
        if log_decay is None:
            log_decay = torch.zeros(T, HV, K, dtype=q.dtype)
        elif log_decay.dim() == 2:
            log_decay = log_decay[:, :, None].expand(T, HV, K)
        return _chunked_gated_delta(q, k, v, beta, log_decay, S, C=16)
    return run


def _qwen_chunked_as_recurrent(calls: list):
    """qwen.gdn_recurrent's signature on the chunked form (chunks of 16, q/k heads repeated to the value heads,
    the per-head decay spread over the channels); appends T to calls."""
    def run(q, k, v, beta, g, S, key_head):
        calls.append(q.shape[0])
        T, Hv, dk = q.shape[0], v.shape[1], q.shape[2]
        return _chunked_gated_delta(q[:, key_head], k[:, key_head], v, beta, g[:, :, None].expand(T, Hv, dk), S, C=16)
    return run


def _grad_case(family: str, root: str, grad_case: Optional[grad_goldens.GradCase] = None) -> tuple:
    """(grad_goldens.Model, stored tensors, tokens [B, T + 1]) of a gradient-golden case of the family (by
    default its first, grad_goldens.GRAD_CASES[family][0]), written under root by the family's build_case."""
    grad_case = grad_case or grad_goldens.GRAD_CASES[family][0]
    module = dict(make_goldens.FAMILIES)[family]
    case_dir = os.path.join(root, family, grad_case.case)
    module.build_case(next(c for c in module.CASES if c.name == grad_case.case), case_dir)
    model, stored = grad_goldens.load_case(family, case_dir)
    return model, stored, torch.from_numpy(grad_goldens.grad_tokens(model, grad_case.seed)).long()


def test_chunked_gradients_match_recurrent():
    """Autograd through the chunked form (spec 1.6, chunks of 16) gives the recurrence's gradients within
    1e-10 relative RMS in float64: with respect to every input (q, k, v, beta, log decay per head or per
    channel, S0; beta on and off) of a random 37-token problem, and with respect to every parameter of every
    delta-rule gradient-golden case (each family's list in grad_goldens.GRAD_CASES: T = 20, a full chunk and a
    partial one) with the chunked form swapped in for the models' recurrence (delta_family's, which
    kimi_linear's and kimi_k3's KDA use too; qwen.gdn_recurrent for the Qwen families). The models themselves
    only run the recurrence."""
    gen = torch.Generator().manual_seed(13)
    T, HV, K, V = 37, 2, 5, 4
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    raw = {"q": rand(T, HV, K), "k": rand(T, HV, K), "v": rand(T, HV, V), "beta": rand(T, HV), "S0": rand(HV, K, V),
           "head": rand(T, HV), "channel": rand(T, HV, K)}
    weights_o, weights_S = rand(T, HV, V), rand(HV, K, V)
    for gate in ("none", "head", "channel"):
        for use_beta in (True, False):
            grads = []
            for form in (delta_family.gated_delta_recurrent, _chunked_as_recurrent([])):
                x = {n: t.clone().requires_grad_() for n, t in raw.items()}
                q = delta_family.l2_normalize(x["q"]) * K ** -0.5
                k = delta_family.l2_normalize(x["k"])
                beta = 2 * torch.sigmoid(x["beta"]) if use_beta else None
                log_decay = {"none": None, "head": -F.softplus(x["head"]), "channel": -torch.exp(x["channel"])}[gate]
                o, S = form(q, k, x["v"], beta, log_decay, x["S0"])
                loss = (o * weights_o).sum() + (S * weights_S).sum()
                grads.append(dict(zip(x, torch.autograd.grad(loss, list(x.values()), allow_unused=True))))
            for name, want in grads[0].items():
                got = grads[1][name]
                if want is None:
                    assert got is None, (gate, use_beta, name)
                    continue
                err = relative_rms(got, want)
                assert err < 1e-10, f"gate {gate}, beta {use_beta}: d/d{name} chunked vs recurrent {err:.3g}"
    with tempfile.TemporaryDirectory() as root:
        families = ("linear_attn", "delta_net", "gated_deltanet", "kda", "kimi_linear", "kimi_k3", *qwen.FAMILIES)
        for family, grad_case in [(f, g) for f in families for g in grad_goldens.GRAD_CASES[f]]:
            model, stored, tokens = _grad_case(family, root, grad_case)
            label = f"{family}/{grad_case.case}"
            loss, want, _ = grad_goldens.loss_and_grads(model, stored, tokens, torch.float64)
            calls = []
            saved = delta_family.gated_delta_recurrent, kimi_linear.gated_delta_recurrent, qwen.gdn_recurrent
            delta_family.gated_delta_recurrent = kimi_linear.gated_delta_recurrent = _chunked_as_recurrent(calls)
            qwen.gdn_recurrent = _qwen_chunked_as_recurrent(calls)
            try:
                chunked_loss, got, _ = grad_goldens.loss_and_grads(model, stored, tokens, torch.float64)
            finally:
                delta_family.gated_delta_recurrent, kimi_linear.gated_delta_recurrent, qwen.gdn_recurrent = saved
            assert calls and all(t == grad_goldens.T for t in calls), (label, calls)
            assert abs(float(chunked_loss - loss)) < 1e-12 * float(loss), label
            for name, g in want.items():
                if g is None:
                    assert got[name] is None, (label, name)
                    continue
                err = relative_rms(got[name], g)
                assert err < 1e-10, f"{label}: d loss/d {name}: chunked vs recurrent {err:.3g}"


def test_grad_goldens_match_finite_differences():
    """The gradient goldens' autograd gradients (grad_goldens.loss_and_grads, float64) against central finite
    differences of the same loss (step 1e-5) at the largest-gradient entry of several tensors, relative error
    <= 1e-6 (~1e-8 measured), on each family's first case (grad_goldens.GRAD_CASES[family][0]): gpt2/f32_tanh
    (the tied wte takes the embedding's and the head's share), kda/attnres (per-channel decay, short conv,
    output gate, AttnRes pseudo-query and norm), qwen3_next/f32_sharded (interleaved in_proj_qkvz / _ba, GDN
    decay and conv, gated norm, 1 + w norms, gated attention, router and per-expert tensors), qwen3_5/f32 (tied
    embedding), qwen3_5_moe/f32 (fused experts)."""
    picks = {
        "gpt2": ["wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.bias", "h.0.ln_1.weight",
                 "ln_f.bias"],
        "kda": ["model.embeddings.weight", "model.layers.1.attn.A_log", "model.layers.1.attn.dt_bias",
                "model.layers.0.attn.f_proj.1.weight", "model.layers.2.attn.q_conv1d.weight",
                "model.layers.0.attn.b_proj.weight", "model.layers.1.attn.g_proj.1.bias",
                "model.layers.2.attn_res_proj.weight", "model.res_norm.weight", "lm_head.weight"],
        "qwen3_next": ["model.layers.0.linear_attn.in_proj_qkvz.weight", "model.layers.1.linear_attn.in_proj_ba.weight",
                       "model.layers.2.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias",
                       "model.layers.1.linear_attn.conv1d.weight", "model.layers.0.linear_attn.norm.weight",
                       "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_norm.weight",
                       "model.layers.2.mlp.gate.weight", "model.layers.1.mlp.experts.3.up_proj.weight",
                       "model.layers.0.mlp.shared_expert_gate.weight", "model.norm.weight"],
        "qwen3_5": ["model.language_model.embed_tokens.weight",
                    "model.language_model.layers.0.linear_attn.in_proj_z.weight",
                    "model.language_model.layers.3.self_attn.q_norm.weight"],
        "qwen3_5_moe": ["model.language_model.layers.0.mlp.experts.gate_up_proj",
                        "model.language_model.layers.2.mlp.experts.down_proj",
                        "model.language_model.layers.1.linear_attn.in_proj_qkv.weight",
                        "model.language_model.layers.2.linear_attn.in_proj_a.weight"],
    }
    step = 1e-5
    with tempfile.TemporaryDirectory() as root:
        for family, names in picks.items():
            model, stored, tokens = _grad_case(family, root)
            _, grads, _ = grad_goldens.loss_and_grads(model, stored, tokens, torch.float64)
            base = {n: t.double() if t.is_floating_point() else t for n, t in stored.items()}
            for name in names:
                g = grads[name].flatten()
                i = int(g.abs().argmax())

                def loss_at(delta):
                    t = base[name].clone()
                    t.view(-1)[i] += delta
                    with torch.no_grad():
                        return float(grad_goldens.loss_fn(model, {**base, name: t}, tokens))

                fd = (loss_at(step) - loss_at(-step)) / (2 * step)
                err = abs(fd - float(g[i])) / abs(float(g[i]))
                assert err <= 1e-6, f"{family} {name}[{i}]: autograd {float(g[i]):.10g}, finite differences {fd:.10g}"


def test_delta_family_decode_matches_prefill():
    """One token at a time through the cache (conv tails, S, z) reproduces the prefill logits."""
    for case in delta_family_goldens.CASES:
        cfg = delta_family.FlaConfig.from_json(case.json_config())
        params = delta_family_goldens.init_params(cfg, torch.Generator().manual_seed(case.seed))
        tensors = delta_family_goldens.checkpoint_tensors(case, params)
        w = delta_family.canonical_weights(cfg, tensors, torch.float64)
        tokens = torch.from_numpy(case_tokens(case, cfg)).long()
        bf16 = delta_family.bf16_weight_names(tensors)
        for inputs in ((frozenset(), bf16) if bf16 else (frozenset(),)):
            prefill = delta_family.fla_forward(cfg, w, tokens, bf16_inputs=inputs)
            decode = _cached_decode(delta_family.fla_forward, delta_family.initial_cache(cfg, torch.float64), cfg, w,
                                    tokens, bf16_inputs=inputs)
            err = relative_rms(decode, prefill)
            assert err < 1e-12, (f"{case.model_type}/{case.name}{' bf16 inputs' if inputs else ''}: decode vs "
                                 f"prefill relative RMS {err:.3g}")



def test_bench_train_matches_recurrence():
    """bench_train.py's delta-rule models (the `lineage bench-train --pytorch` baseline: fla's naive chunked
    forms, chunks of 64) against delta_family's token-by-token recurrence at 1 layer x 64, T = 128 (two
    chunks), one sequence, the golden cases' init: each model type's mixer output (fla_mixer vs
    linear_attention / delta_mixer) and logits (fla_logits vs fla_forward), within 1e-12 relative RMS in
    float64 (the same function) and 1e-5 in float32 (the baseline's dtype; ~5e-7 measured); and the
    additive write with a per-head decay (lineage_delta_rule false, which delta_family does not build) at the
    kernel, T = 100 (a padded chunk)."""
    base = {"vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 1, "num_heads": 4, "intermediate_size": 96}
    extra = {"linear_attn": {"feature_map": "elu", "norm_feature_map": True},
             "delta_net": {},
             "gated_deltanet": {"head_dim": 16, "expand_v": 1.0, "num_v_heads": 8},
             "kda": {"head_dim": 16, "expand_v": 1.0}}
    T, p = 128, "model.layers.0.attn."
    for model_type, fields in extra.items():
        cfg = delta_family.FlaConfig.from_json({"model_type": model_type, **base, **fields})
        params = delta_family_goldens.init_params(cfg, torch.Generator().manual_seed(21))
        x = torch.randn(1, T, cfg.hidden_size, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
        tokens = torch.from_numpy(np.random.RandomState(23).randint(0, cfg.vocab_size, T)).long()
        mixer = delta_family.linear_attention if model_type == "linear_attn" else delta_family.delta_mixer
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
            w = delta_family.Weights(delta_family.canonical_weights(cfg, params, dtype))
            want = mixer(cfg, w, p, x[0].to(dtype), delta_family.initial_cache(cfg, dtype)[0], lambda name, t: t)
            err = relative_rms(bench_train.fla_mixer(cfg, w, p, x.to(dtype))[0], want)
            assert err < tol, f"{model_type} {dtype}: chunked mixer vs recurrence relative RMS {err:.3g}"
            logits = bench_train.fla_logits(cfg, w, tokens[None])[0]
            err = relative_rms(logits, delta_family.fla_forward(cfg, w, tokens))
            assert err < tol, f"{model_type} {dtype}: logits vs fla_forward relative RMS {err:.3g}"
    gen = torch.Generator().manual_seed(24)
    T, HV, K, V = 100, 3, 16, 8
    q = delta_family.l2_normalize(torch.randn(T, HV, K, generator=gen, dtype=torch.float64)) * K ** -0.5
    k = delta_family.l2_normalize(torch.randn(T, HV, K, generator=gen, dtype=torch.float64))
    v, a = torch.randn(T, HV, V, generator=gen, dtype=torch.float64), -F.softplus(torch.randn(T, HV, generator=gen))
    want, _ = delta_family.gated_delta_recurrent(q, k, v, None, a.double(), torch.zeros(HV, K, V, dtype=torch.float64))
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        heads = [t.to(dtype).transpose(0, 1)[None] for t in (q, k, v, a)]
        got = bench_train.chunked_mixer(heads[0], heads[1], heads[2], None, heads[3])[0].transpose(0, 1)
        err = relative_rms(got, want)
        assert err < tol, f"additive write, per-head decay, {dtype}: chunked vs recurrence relative RMS {err:.3g}"


def test_fla_attnres_matches_block_formulation():
    """fla's Block AttnRes (attnres_block_size B in sublayers; the kda golden case, and every model type
    with B = 1 (full AttnRes), 2, 4, 6 over 3 layers) against the paper's block formulation written from
    scratch in sublayer units: sublayer j is layer j // 2's attention (j even) or MLP (j odd), o_j its
    output (attn.out / mlp.out), chunk n = o_{nB} + .. + o_{nB+B-1} (cut at 2L); sublayer j mixes
    [embedding, chunks n < j // B, the partial o_{(j//B)B} + .. + o_{j-1} when non-empty] (j = 0: no mix,
    the embedding itself) and its norm takes the mix; the output mix takes [embedding, every chunk] and
    feeds model.norm. Keys RMS-normalized with the folded pseudo-query norm.weight * proj.weight[0]
    (fused_attnres's q * w); softmax over sources; raw sources summed. Also fla's config rule for B."""
    cases = [c for c in delta_family_goldens.CASES if c.config.get("attnres_block_size") is not None]
    assert cases, "no delta-family golden case with attnres_block_size"
    for model_type in delta_family.MODEL_TYPES:
        base = next(c for c in delta_family_goldens.CASES if c.model_type == model_type)
        cases += [dataclasses.replace(base, name=f"{base.name}_attnres{B}", T=12,
                                      config={**base.config, "num_hidden_layers": 3, "attnres_block_size": B})
                  for B in (1, 2, 4, 6)]
    for case in cases:
        label = f"{case.model_type}/{case.name}"
        cfg = delta_family.FlaConfig.from_json(case.json_config())
        params = delta_family_goldens.init_params(cfg, torch.Generator().manual_seed(case.seed))
        tensors = delta_family_goldens.checkpoint_tensors(case, params)
        w = delta_family.canonical_weights(cfg, tensors, torch.float64)
        tokens = torch.from_numpy(case_tokens(case, cfg)).long()
        rec = {}
        delta_family.fla_forward(cfg, w, tokens, rec)
        assert [(k, list(t.shape)) for k, t in rec.items()] == delta_family.intermediate_shapes(cfg, case.T), label
        B, L, eps = cfg.attnres_block_size, cfg.num_hidden_layers, cfg.norm_eps

        def mix(sources, prefix):
            return _folded_mix(w, sources, prefix, eps)

        def norm(x, name):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

        outs = [rec[f"h{i}.{s}"] for i in range(L) for s in ("attn.out", "mlp.out")]
        chunks = [sum(outs[n:n + B]) for n in range(0, 2 * L, B)]
        for j in range(2 * L):
            i, b = j // 2, j // B
            p, n = f"model.layers.{i}.", f"h{i}."
            res, pre, after = (("attn_res", "attn_norm", "resid_mid"), ("mlp_res", "mlp_norm", "out"))[j % 2]
            if j == 0:
                x = rec["embed"]
                assert n + "attn_res.weights" not in rec, label
            else:
                partial = [sum(outs[b * B:j])] if j > b * B else []
                x, weights = mix([rec["embed"]] + chunks[:b] + partial, p + res)
                assert relative_rms(rec[n + res + ".weights"], weights) < 1e-13, (label, j)
            assert relative_rms(rec[n + pre], norm(x, p + pre + ".weight")) < 1e-13, (label, j)
            assert relative_rms(rec[n + after], sum(outs[b * B:j + 1])) < 1e-13, (label, j)
        y, weights = mix([rec["embed"]] + chunks, "model.res")
        assert relative_rms(rec["output_res.weights"], weights) < 1e-13, label
        assert relative_rms(rec["norm"], norm(y, "model.norm.weight")) < 1e-13, label
    config = {"model_type": "kda", "vocab_size": 16, "num_hidden_layers": 1, "hidden_size": 32}
    for good in (None, 1, 2, 4, 12):
        delta_family.FlaConfig.from_json({**config, "attnres_block_size": good})
    for bad in (0, -2, 3, 5, True, 2.0, "4"):
        try:
            delta_family.FlaConfig.from_json({**config, "attnres_block_size": bad})
        except ValueError:
            continue
        raise AssertionError(f"attnres_block_size {bad!r} was accepted")


def _kimi_case(case):
    """(cfg, checkpoint tensors, float64 weights, tokens) of a kimi_linear golden case, without writing it."""
    cfg = kimi_linear.KimiConfig.from_json(case.json_config())
    params = kimi_linear_goldens.init_params(case, cfg, torch.Generator().manual_seed(case.seed))
    tensors = kimi_linear_goldens.checkpoint_tensors(case, params)
    w = kimi_linear.canonical_weights(cfg, tensors, torch.float64)
    tokens = torch.from_numpy(case_tokens(case, cfg)).long()
    return cfg, tensors, w, tokens


def test_kimi_decode_matches_prefill():
    """One token at a time through the cache (KDA S and conv tails, MLA latents and k_r), with the explicit
    and the absorbed MLA form (spec 2.4), reproduces the explicit prefill; BF16 cases with bf16 inputs too."""
    for case in kimi_linear_goldens.CASES:
        cfg, tensors, w, tokens = _kimi_case(case)
        prefill = kimi_linear.kimi_forward(cfg, w, tokens)
        for form in ("explicit", "absorbed"):
            decode = _cached_decode(kimi_linear.kimi_forward, kimi_linear.initial_cache(cfg, torch.float64), cfg, w,
                                    tokens, mla_form=form)
            err = relative_rms(decode, prefill)
            assert err < 1e-10, f"kimi_linear/{case.name}: {form} decode vs explicit prefill relative RMS {err:.3g}"
        bf16 = kimi_linear.bf16_weight_names(tensors)
        if bf16:
            prefill = kimi_linear.kimi_forward(cfg, w, tokens, bf16_inputs=bf16)
            decode = _cached_decode(kimi_linear.kimi_forward, kimi_linear.initial_cache(cfg, torch.float64), cfg, w,
                                    tokens, bf16_inputs=bf16)
            err = relative_rms(decode, prefill)
            assert err < 1e-12, f"kimi_linear/{case.name}: bf16 inputs: decode vs prefill relative RMS {err:.3g}"


def test_kimi_absorbed_mla_matches_explicit():
    """The absorbed MLA form equals the explicit one to 1e-10 on every MLA intermediate of every case, and on
    random wider layers continuing a cache, with and without RoPE."""
    for case in kimi_linear_goldens.CASES:
        cfg, _, w, tokens = _kimi_case(case)
        explicit, absorbed = {}, {}
        kimi_linear.kimi_forward(cfg, w, tokens, explicit)
        kimi_linear.kimi_forward(cfg, w, tokens, absorbed, mla_form="absorbed")
        err = max(relative_rms(absorbed[n], explicit[n]) for n in explicit)
        assert err < 1e-10, f"kimi_linear/{case.name}: absorbed vs explicit relative RMS {err:.3g}"
    gen = torch.Generator().manual_seed(5)
    base = kimi_linear_goldens.CASES[0].json_config()
    for nope in (True, False):
        cfg = kimi_linear.KimiConfig.from_json({**base, "num_attention_heads": 3, "num_key_value_heads": 3,
                                                "kv_lora_rank": 48, "qk_nope_head_dim": 24, "qk_rope_head_dim": 12,
                                                "v_head_dim": 20, "mla_use_nope": nope})
        D, n, r = cfg.hidden_size, 3, 48
        shapes = {"q_proj.weight": [n * 36, D], "kv_a_proj_with_mqa.weight": [r + 12, D],
                  "kv_a_layernorm.weight": [r], "kv_b_proj.weight": [n * 44, r], "o_proj.weight": [D, n * 20]}
        w = delta_family.Weights({"a." + k: torch.randn(s, generator=gen, dtype=torch.float64)
                                  for k, s in shapes.items()})
        x = torch.randn(23, D, generator=gen, dtype=torch.float64)
        outs = {}
        for form in ("explicit", "absorbed"):
            state = {"latent": torch.zeros(0, r, dtype=torch.float64),
                     "k_rope": torch.zeros(0, 12, dtype=torch.float64)}
            parts = [kimi_linear.mla_mixer(cfg, w, "a.", part, state, lambda name, t: t, form)
                     for part in (x[:9], x[9:])]  # the second part continues the first's latent cache
            outs[form] = torch.cat(parts)
        err = relative_rms(outs["absorbed"], outs["explicit"])
        assert err < 1e-10, f"random MLA (nope={nope}): absorbed vs explicit relative RMS {err:.3g}"


def test_kimi_mla_matches_per_head_loop():
    """MLA (RoPE on) against a plain loop over heads and tokens with F.softmax and the rotation written as
    complex multiplication."""
    gen = torch.Generator().manual_seed(6)
    cfg = kimi_linear.KimiConfig.from_json({**kimi_linear_goldens.CASES[0].json_config(), "mla_use_nope": False,
                                            "rope_theta": 500.0})
    D, n, r, dn, dr, dv, T = cfg.hidden_size, 4, 32, 16, 8, 16, 12
    shapes = {"q_proj.weight": [n * (dn + dr), D], "kv_a_proj_with_mqa.weight": [r + dr, D],
              "kv_a_layernorm.weight": [r], "kv_b_proj.weight": [n * (dn + dv), r], "o_proj.weight": [D, n * dv]}
    raw = {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()}
    x = torch.randn(T, D, generator=gen, dtype=torch.float64)
    state = {"latent": torch.zeros(0, r, dtype=torch.float64), "k_rope": torch.zeros(0, dr, dtype=torch.float64)}
    got = kimi_linear.mla_mixer(cfg, delta_family.Weights({"a." + k: t for k, t in raw.items()}), "a.", x, state,
                                lambda name, t: t)

    def rotate(v, pos):  # v [..., dr] interleaved pairs as complex numbers
        freq = 500.0 ** (-torch.arange(0, dr, 2, dtype=torch.float64) / dr)
        z = torch.view_as_complex(v.reshape(*v.shape[:-1], dr // 2, 2).contiguous())
        return torch.view_as_real(z * torch.polar(torch.ones_like(freq), pos * freq)).flatten(-2)

    q = F.linear(x, raw["q_proj.weight"]).view(T, n, dn + dr)
    ckr = F.linear(x, raw["kv_a_proj_with_mqa.weight"])
    c = ckr[:, :r] / torch.sqrt(ckr[:, :r].pow(2).mean(-1, keepdim=True) + 1e-6) * raw["kv_a_layernorm.weight"]
    kv = F.linear(c, raw["kv_b_proj.weight"]).view(T, n, dn + dv)
    ctx = torch.zeros(T, n, dv, dtype=torch.float64)
    for h in range(n):
        for t in range(T):
            qt = torch.cat([q[t, h, :dn], rotate(q[t, h, dn:], t)])
            keys = torch.stack([torch.cat([kv[j, h, :dn], rotate(ckr[j, r:], j)]) for j in range(t + 1)])
            p = F.softmax(keys @ qt / math.sqrt(dn + dr), dim=0)
            ctx[t, h] = p @ kv[:t + 1, h, dn:]
    want = F.linear(ctx.reshape(T, n * dv), raw["o_proj.weight"])
    assert relative_rms(got, want) < 1e-13, relative_rms(got, want)


def test_kimi_rope_layouts():
    """Interleaved RoPE: position 0 is the identity, and HF's rope_interleave form (permute to half-split,
    then rotate_half) gives the same values in the half-split order, so every q.k is the same."""
    gen = torch.Generator().manual_seed(7)
    T, n, d = 9, 3, 8
    x = torch.randn(T, n, d, generator=gen, dtype=torch.float64)
    pos = torch.arange(5, 5 + T)
    ours = kimi_linear.rope_interleaved(x, pos, 10000.0)
    assert torch.equal(kimi_linear.rope_interleaved(x[:1], torch.zeros(1, dtype=torch.long), 10000.0), x[:1])
    half = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.cat([pos[:, None] * freq, pos[:, None] * freq], dim=-1)[:, None, :]
    rotated_half = torch.cat([-half[..., d // 2:], half[..., :d // 2]], dim=-1)
    hf = half * angle.cos() + rotated_half * angle.sin()
    assert relative_rms(hf, torch.cat([ours[..., 0::2], ours[..., 1::2]], dim=-1)) < 1e-15


def test_kimi_kda_matches_delta_family():
    """Kimi's KDA under its own names equals delta_family's fla KDA with the weights renamed (f_proj.0/1,
    g_proj.0/1 with a zero bias, A_log [H]), on every intermediate and the output."""
    cfg, _, w, tokens = _kimi_case(kimi_linear_goldens.CASES[0])
    fcfg = delta_family.FlaConfig.from_json({"model_type": "kda", "vocab_size": cfg.vocab_size,
                                             "hidden_size": cfg.hidden_size, "num_hidden_layers": 1,
                                             "num_heads": cfg.kda_num_heads, "head_dim": cfg.kda_head_dim,
                                             "conv_size": cfg.conv_size, "norm_eps": cfg.rms_norm_eps})
    p = "model.layers.1.self_attn."
    rename = {"f_a_proj.weight": "f_proj.0.weight", "f_b_proj.weight": "f_proj.1.weight",
              "g_a_proj.weight": "g_proj.0.weight", "g_b_proj.weight": "g_proj.1.weight"}
    fla = {"x." + rename.get(k[len(p):], k[len(p):]): t for k, t in w.items() if k.startswith(p)}
    fla["x.A_log"] = fla["x.A_log"].reshape(-1)
    fla["x.g_proj.1.bias"] = torch.zeros(cfg.kda_dim, dtype=torch.float64)
    x = torch.randn(40, cfg.hidden_size, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    ours, theirs = {}, {}
    out = kimi_linear.kda_mixer(cfg, delta_family.Weights(w), p, x, kimi_linear.initial_cache(cfg, torch.float64)[1],
                                lambda name, t: ours.__setitem__(name, t) or t)
    ref = delta_family.delta_mixer(fcfg, delta_family.Weights(fla), "x.", x,
                                   delta_family.initial_cache(fcfg, torch.float64)[0],
                                   lambda name, t: theirs.__setitem__(name, t) or t)
    assert list(ours) == list(theirs), (list(ours), list(theirs))
    for name in ours:
        assert relative_rms(ours[name], theirs[name]) < 1e-15, name
    assert relative_rms(out, ref) < 1e-15


def _router_cfg(**overrides):
    d = {**kimi_linear_goldens.CASES[0].json_config(), "num_experts": 8, "num_experts_per_token": 3,
         "num_expert_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, **overrides}
    return kimi_linear.KimiConfig.from_json(d)


def test_kimi_router_ties_and_masks():
    """Deterministic ties (larger biased score first, then lower expert / group index), the 0.0 group mask
    (a masked expert outranks a kept one with s' < 0, masked ties go to the lower index), unbiased weights,
    and router_bias_in_weights taking s + b (before the mask) at the selected experts."""
    zero = torch.zeros(1, 8, dtype=torch.float64)
    bias = torch.zeros(8, dtype=torch.float64)
    sel = kimi_linear.route(_router_cfg(), zero, bias)
    assert sel.ids.tolist() == [[0, 1, 2]]
    assert torch.allclose(sel.weights, torch.full((1, 3), 1 / 3, dtype=torch.float64))
    bias[5] = bias[2] = 0.1
    assert kimi_linear.route(_router_cfg(), zero, bias).ids.tolist() == [[2, 5, 0]]
    # 4 groups of 2: equal group scores keep the lower groups; a tie between groups 1 and 3 keeps both.
    grouped = _router_cfg(num_expert_group=4, topk_group=2, num_experts_per_token=2)
    assert kimi_linear.route(grouped, zero, torch.zeros(8, dtype=torch.float64)).ids.tolist() == [[0, 1]]
    b = torch.zeros(8, dtype=torch.float64)
    b[[2, 3, 6, 7]] = 0.1
    assert kimi_linear.route(grouped, zero, b).ids.tolist() == [[2, 3]]
    # One group kept (experts 4, 5: s' = 0.5, -0.1); everything else masked to 0.0, which outranks -0.1.
    one = _router_cfg(num_expert_group=4, topk_group=1, num_experts_per_token=3, routed_scaling_factor=2.0)
    b = torch.full((8,), -0.6, dtype=torch.float64)
    b[4] = 0.0
    sel = kimi_linear.route(one, zero, b)
    assert sel.ids.tolist() == [[4, 0, 1]] and bool(sel.zero_mask_changes[0])
    assert torch.allclose(sel.weights, torch.full((1, 3), 2.0 / 3, dtype=torch.float64))
    assert math.isclose(float(sel.expert_margin[0]), 0.1)  # exact 0.0 tie at the cut: margin = nearest kept |s'|
    sel = kimi_linear.route(dataclasses.replace(one, router_bias_in_weights=True), zero, b)
    assert sel.ids.tolist() == [[4, 0, 1]]
    assert torch.allclose(sel.weights, torch.tensor([[0.5, -0.1, -0.1]], dtype=torch.float64) / 0.3 * 2.0)
    # k = 1: no renormalization, weight = scaling * sigmoid(logit).
    single = _router_cfg(num_experts_per_token=1, routed_scaling_factor=2.446)
    logits = torch.tensor([[0.3, 1.2, -0.4, 0.0, 0.5, 0.1, 0.2, 1.1]], dtype=torch.float64)
    sel = kimi_linear.route(single, logits, torch.zeros(8, dtype=torch.float64))
    assert sel.ids.tolist() == [[1]] and torch.allclose(sel.weights, 2.446 * torch.sigmoid(logits[:, 1:2]))
    assert kimi_linear.rank_descending(torch.tensor([0.0, -0.0, 1.0, 0.0])).tolist() == [2, 0, 1, 3]


def test_kimi_moe_single_expert_equals_dense_mlp():
    """E = 1, k = 1, scaling 1, no shared expert, no renormalization: the MoE is the dense SwiGLU scaled by
    the single weight sigmoid(logit) (Kimi renormalizes only when k > 1); and two identical experts with
    k = 2 and renormalization (weights summing to 1) give the dense SwiGLU itself."""
    gen = torch.Generator().manual_seed(9)
    D, I, T = 64, 32, 11
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64) / math.sqrt(s[-1])  # noqa: E731
    w1, w3, w2, gate = rand(I, D), rand(I, D), rand(D, I), rand(1, D)
    x = torch.randn(T, D, generator=gen, dtype=torch.float64)
    dense = F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)
    base = {**kimi_linear_goldens.CASES[0].json_config(), "num_shared_experts": 0, "routed_scaling_factor": 1.0,
            "num_expert_group": 1, "topk_group": 1}
    cfg = kimi_linear.KimiConfig.from_json({**base, "num_experts": 1, "num_experts_per_token": 1,
                                            "moe_renormalize": False})
    w = {"m.gate.weight": gate, "m.gate.e_score_correction_bias": torch.tensor([0.3], dtype=torch.float64),
         "m.experts.0.w1.weight": w1, "m.experts.0.w3.weight": w3, "m.experts.0.w2.weight": w2}
    out, sel = kimi_linear.moe_block(cfg, delta_family.Weights(w), "m.", x, lambda name, t: t)
    assert sel.ids.eq(0).all()
    assert relative_rms(out, torch.sigmoid(F.linear(x, gate)) * dense) < 1e-15
    cfg = kimi_linear.KimiConfig.from_json({**base, "num_experts": 2, "num_experts_per_token": 2,
                                            "moe_renormalize": True})
    w = {"m.gate.weight": rand(2, D), "m.gate.e_score_correction_bias": torch.zeros(2, dtype=torch.float64)}
    for e in range(2):
        w.update({f"m.experts.{e}.w1.weight": w1, f"m.experts.{e}.w3.weight": w3, f"m.experts.{e}.w2.weight": w2})
    out, _ = kimi_linear.moe_block(cfg, delta_family.Weights(w), "m.", x, lambda name, t: t)
    assert relative_rms(out, dense) < 1e-15


def test_kimi_config():
    """The layer schedule of the published 48B config, and options the reference does not implement raise."""
    import json as _json
    published = os.path.join("/work/shared/data/kimi-linear-48b-a3b", "config.json")
    if os.path.exists(published):
        with open(published) as f:
            cfg = kimi_linear.KimiConfig.from_json(_json.load(f))
        assert [i for i in range(27) if cfg.layer_kind(i) == "mla"] == [3, 7, 11, 15, 19, 23, 26]
        assert [cfg.ffn_kind(i) for i in range(3)] == ["dense", "moe", "moe"]
        assert not cfg.router_bias_in_weights and cfg.mla_use_nope
    grouped = kimi_linear.KimiConfig.from_json(kimi_linear_goldens.CASES[2].json_config())
    assert [grouped.ffn_kind(i) for i in range(5)] == ["dense", "dense", "moe", "dense", "moe"]
    assert [grouped.layer_kind(i) for i in range(5)] == ["kda", "kda", "mla", "kda", "mla"]
    base = kimi_linear_goldens.CASES[0].json_config()
    for bad in ({"q_lora_rank": 16}, {"rope_scaling": {"type": "yarn"}}, {"hidden_act": "gelu"},
                {"linear_attn_config": {**base["linear_attn_config"], "kda_layers": [1, 2, 3, 4]}},
                {"num_key_value_heads": 2}, {"mla_use_output_gate": True}, {"num_expert_group": 3}):
        try:
            kimi_linear.KimiConfig.from_json({**base, **bad})
        except ValueError:
            continue
        raise AssertionError(f"config {bad} was accepted")
    try:
        kimi_linear.KimiConfig.from_json({k: v for k, v in base.items() if k != "rms_norm_eps"})
        raise AssertionError("a config without rms_norm_eps was accepted")
    except ValueError:
        pass

def _k3_case(case):
    """(cfg, checkpoint tensors, float64 weights, tokens) of a kimi_k3 golden case, without writing it."""
    cfg = kimi_k3.K3Config.from_json(case.json_config())
    tensors = kimi_k3_goldens.init_checkpoint(case, cfg, torch.Generator().manual_seed(case.seed))
    w = kimi_k3.canonical_weights(cfg, tensors, torch.float64)
    tokens = torch.from_numpy(case_tokens(case, cfg)).long()
    return cfg, tensors, w, tokens


def test_k3_decode_matches_prefill():
    """Token-by-token decode through the cache (explicit and absorbed MLA; bf16 inputs for the BF16 case)
    reproduces the explicit prefill: AttnRes is token-local, the KDA and MLA caches carry the rest."""
    for case in kimi_k3_goldens.CASES:
        cfg, tensors, w, tokens = _k3_case(case)
        bf16 = kimi_k3.bf16_linear_inputs(cfg, tensors)
        runs = [("explicit", frozenset()), ("absorbed", frozenset())] + ([("explicit", bf16)] if bf16 else [])
        for form, inputs in runs:
            prefill = kimi_k3.k3_forward(cfg, w, tokens, bf16_inputs=inputs)
            decode = _cached_decode(kimi_k3.k3_forward, kimi_linear.initial_cache(cfg, torch.float64), cfg, w, tokens,
                                    mla_form=form, bf16_inputs=inputs)
            err = relative_rms(decode, prefill)
            assert err < 1e-10, f"kimi_k3/{case.name} {form}{' bf16' if inputs else ''}: decode vs prefill {err:.3g}"


def test_k3_attn_res_matches_block_formulation():
    """The recorded mixes against the paper's block variant written from scratch: sources = [embedding,
    completed block sums S_n (the outputs of layers nB..nB+B-1), the current block's partial sum], the
    first layer of a block without the (empty) partial; keys RMS-normalized with the folded pseudo-query
    norm.weight * proj.weight[0] (the engine's fold); softmax over sources; raw sources summed."""
    for case in kimi_k3_goldens.CASES:
        cfg, _, w, tokens = _k3_case(case)
        rec = {}
        kimi_k3.k3_forward(cfg, w, tokens, rec)
        B, L, eps = cfg.attn_res_block_size, cfg.num_hidden_layers, cfg.rms_norm_eps

        def mix(sources, prefix):
            return _folded_mix(w, sources, prefix, eps)

        def norm(x, name):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

        outputs = [rec[f"h{i}.attn.out"] + rec[f"h{i}.mlp.out" if cfg.ffn_kind(i) == "dense" else f"h{i}.moe.out"]
                   for i in range(L)]

        def block_sources(i):  # [emb, S_0 .. S_{b-1}] and the outputs of layers bB..i-1 (b = i // B)
            b = i // B
            return [rec["embed"]] + [sum(outputs[n * B:(n + 1) * B]) for n in range(b)], outputs[b * B:i]

        for i in range(L):
            p = f"model.layers.{i}."
            done, partial = block_sources(i)
            if i == 0:
                x = rec["embed"]
                assert f"h{i}.attn_res.weights" not in rec
            else:
                x, weights = mix(done + ([sum(partial)] if partial else []), p + "self_attention_res")
                assert relative_rms(rec[f"h{i}.attn_res.weights"], weights) < 1e-13, (case.name, i)
            assert relative_rms(rec[f"h{i}.input_layernorm"], norm(x, p + "input_layernorm.weight")) < 1e-13
            current = sum(partial) + rec[f"h{i}.attn.out"] if partial else rec[f"h{i}.attn.out"]
            assert relative_rms(rec[f"h{i}.resid_mid"], current) < 1e-13, (case.name, i)
            x, weights = mix(done + [current], p + "mlp_res")
            assert relative_rms(rec[f"h{i}.mlp_res.weights"], weights) < 1e-13, (case.name, i)
            assert relative_rms(rec[f"h{i}.post_attention_layernorm"],
                                norm(x, p + "post_attention_layernorm.weight")) < 1e-13
            assert relative_rms(rec[f"h{i}.out"], current + outputs[i] - rec[f"h{i}.attn.out"]) < 1e-13
        done, partial = block_sources(L)
        if not partial:  # L a multiple of B: the last block is complete, and is the "partial" of the loop
            done, partial = done[:-1], outputs[(L // B - 1) * B:]
        y, weights = mix(done + [sum(partial)], "model.output_attn_res")
        assert relative_rms(rec["output_res.weights"], weights) < 1e-13, case.name
        assert relative_rms(rec["norm"], norm(y, "model.norm.weight")) < 1e-13, case.name


def test_k3_mxfp4_decode():
    """MXFP4: the code table is E2M1 read from its bit fields (sign, 2 exponent bits with bias 1, 1 mantissa
    bit; exponent 0 subnormal), the low nibble is the even column, scale byte g covers columns 32g..32g+31,
    and a NaN scale (255) raises."""
    def e2m1(c):
        sign, exp, man = (-1.0) ** (c >> 3), (c >> 1) & 3, c & 1
        return sign * (0.5 * man if exp == 0 else 2.0 ** (exp - 1) * (1 + 0.5 * man))
    assert kimi_k3.mxfp4_values().tolist() == [e2m1(c) for c in range(16)]
    gen = torch.Generator().manual_seed(10)
    codes = torch.randint(0, 16, (3, 64), generator=gen)
    scale = torch.randint(100, 140, (3, 2), generator=gen)
    packed, scale_u8 = kimi_k3.pack_mxfp4(codes, scale)
    assert packed.dtype == torch.uint8 and list(packed.shape) == [3, 32] and scale_u8.dtype == torch.uint8
    assert int(packed[1, 5]) == int(codes[1, 10]) | (int(codes[1, 11]) << 4)
    got = kimi_k3.dequantize_mxfp4(packed, scale_u8)
    want = torch.tensor([[e2m1(int(codes[r, c])) * 2.0 ** (int(scale[r, c // 32]) - 127) for c in range(64)]
                         for r in range(3)], dtype=torch.float64)
    assert torch.equal(got, want)
    try:
        kimi_k3.dequantize_mxfp4(packed, torch.full((3, 2), 255, dtype=torch.uint8))
        raise AssertionError("a NaN scale was accepted")
    except ValueError:
        pass
    with tempfile.TemporaryDirectory() as d:  # U8 survives the safetensors round trip
        write_safetensors(os.path.join(d, "x.safetensors"), {"p": packed, "s": scale_u8})
        back = read_safetensors(os.path.join(d, "x.safetensors"))
        assert read_header(os.path.join(d, "x.safetensors"))["p"]["dtype"] == "U8"
        assert torch.equal(back["p"], packed) and torch.equal(back["s"], scale_u8)


def test_k3_kda_matches_delta_family_lower_bound():
    """K3's KDA with the lower-bound gate and the low-rank output gate (text_only, lb -3) equals
    delta_family's fla KDA with lower_bound -3 and the weights renamed (A_log cut to [H] by the loader)."""
    case = next(c for c in kimi_k3_goldens.CASES if c.name == "text_only")
    cfg, _, w, _ = _k3_case(case)
    assert cfg.gate_lower_bound == -3.0 and not cfg.use_full_rank_gate
    fcfg = delta_family.FlaConfig.from_json({"model_type": "kda", "vocab_size": cfg.vocab_size,
                                             "hidden_size": cfg.hidden_size, "num_hidden_layers": 1,
                                             "num_heads": cfg.kda_num_heads, "head_dim": cfg.kda_head_dim,
                                             "conv_size": cfg.conv_size, "norm_eps": cfg.rms_norm_eps,
                                             "lower_bound": cfg.gate_lower_bound})
    p = "model.layers.1.self_attn."
    rename = {"f_a_proj.weight": "f_proj.0.weight", "f_b_proj.weight": "f_proj.1.weight",
              "g_a_proj.weight": "g_proj.0.weight", "g_b_proj.weight": "g_proj.1.weight"}
    fla = {"x." + rename.get(k[len(p):], k[len(p):]): t for k, t in w.items() if k.startswith(p)}
    fla["x.g_proj.1.bias"] = torch.zeros(cfg.kda_dim, dtype=torch.float64)
    x = torch.randn(40, cfg.hidden_size, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    ours, theirs = {}, {}
    out = kimi_linear.kda_mixer(cfg, delta_family.Weights(w), p, x, kimi_linear.initial_cache(cfg, torch.float64)[1],
                                lambda name, t: ours.__setitem__(name, t) or t, kimi_k3.k3_log_decay,
                                kimi_k3.k3_kda_output_gate)
    ref = delta_family.delta_mixer(fcfg, delta_family.Weights(fla), "x.", x,
                                   delta_family.initial_cache(fcfg, torch.float64)[0],
                                   lambda name, t: theirs.__setitem__(name, t) or t)
    assert list(ours) == list(theirs)
    for name in ours:
        assert relative_rms(ours[name], theirs[name]) < 1e-15, name
    assert relative_rms(out, ref) < 1e-15
    assert float(ours["attn.log_decay"].min()) > -3.0


def test_k3_router_inf_mask():
    """K3 masks dropped groups with -inf: a kept expert with s' < 0 beats every masked one (Kimi Linear's
    0.0 mask would take a masked expert instead), and k may not exceed the kept groups' experts."""
    base = kimi_k3_goldens.CASES[0].json_config()
    text = {**base["text_config"], "num_experts": 8, "num_expert_group": 4, "topk_group": 1,
            "num_experts_per_token": 2, "routed_scaling_factor": 2.0}
    cfg = kimi_k3.K3Config.from_json({**base, "text_config": text})
    b = torch.full((8,), -0.6, dtype=torch.float64)
    b[4] = 0.0
    sel = kimi_k3.router(cfg, delta_family.Weights({"gate.weight": torch.zeros(8, 4, dtype=torch.float64),
                                                    "gate.e_score_correction_bias": b}), "",
                         torch.zeros(1, 4, dtype=torch.float64), lambda name, t: t)
    assert sel.ids.tolist() == [[4, 5]] and bool(sel.zero_mask_changes[0])
    assert torch.allclose(sel.weights, torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    assert kimi_linear.route(dataclasses.replace(cfg, group_mask=0.0), torch.zeros(1, 8, dtype=torch.float64),
                             b).ids.tolist() == [[4, 0]]
    try:
        kimi_k3.K3Config.from_json({**base, "text_config": {**text, "num_experts_per_token": 3}})
        raise AssertionError("k = 3 with 2 kept experts was accepted")
    except ValueError:
        pass


def test_k3_latent_moe_matches_per_token_loop():
    """Stable LatentMoE against a loop over tokens and their selected experts with F.linear and SiTU written
    out, the latent norm, the up-projection and the shared expert, in every case's first MoE layer."""
    for case in kimi_k3_goldens.CASES:
        cfg, _, w, _ = _k3_case(case)
        p = "model.layers.1.block_sparse_moe."
        x = torch.randn(9, cfg.hidden_size, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
        got, sel = kimi_k3.latent_moe(cfg, delta_family.Weights(w), p, x, lambda name, t: t)
        b, bl = cfg.situ_beta, cfg.situ_linear_beta

        def situ_mlp(v, gate, up, down):
            g, u = F.linear(v, w[gate]), F.linear(v, w[up])
            capped = u if bl is None else bl * torch.tanh(u / bl)
            return F.linear(b * torch.tanh(g / b) * torch.sigmoid(g) * capped, w[down])

        for t in range(x.shape[0]):
            s = torch.sigmoid(F.linear(x[t], w[p + "gate.weight"]))
            ids = sel.ids[t].tolist()
            weights = s[ids] / (s[ids].sum() + 1e-20) * cfg.routed_scaling_factor
            z = F.linear(x[t], w[p + "routed_expert_down_proj.weight"])
            a = sum(weights[j] * situ_mlp(z, f"{p}experts.{e}.w1.weight", f"{p}experts.{e}.w3.weight",
                                          f"{p}experts.{e}.w2.weight") for j, e in enumerate(ids))
            if cfg.latent_moe_use_norm:
                a = a / torch.sqrt(a.pow(2).mean() + cfg.rms_norm_eps) * w[p + "routed_expert_norm.weight"]
            want = F.linear(a, w[p + "routed_expert_up_proj.weight"])
            want = want + situ_mlp(x[t], p + "shared_experts.gate_proj.weight", p + "shared_experts.up_proj.weight",
                                   p + "shared_experts.down_proj.weight")
            assert relative_rms(got[t], want) < 1e-13, (case.name, t)


def test_k3_config():
    """The published Kimi-K3 and Kimi-K3-0.40B configs parse (layer schedule, gate, quantization, prefix),
    the tensor list of Kimi-K3 counts spec 9.3's 2,779,484,478,208 text parameters, and options the
    reference does not implement raise."""
    import json as _json
    published = "/work/shared/data/kimi-k3/config.json"
    if os.path.exists(published):
        with open(published) as f:
            cfg = kimi_k3.K3Config.from_json(_json.load(f))
        assert [i for i in range(93) if cfg.layer_kind(i) == "mla"] == list(range(3, 92, 4)) + [92]
        assert [cfg.ffn_kind(i) for i in range(3)] == ["dense", "moe", "moe"]
        assert (cfg.gate_lower_bound, cfg.use_full_rank_gate, cfg.tensor_prefix) == (-5.0, True, "language_model.")
        assert (cfg.quantization_format, cfg.q_lora_rank, cfg.attn_res_block_size) == ("mxfp4-pack-quantized", 1536, 12)
        assert (cfg.hidden_act, cfg.situ_beta, cfg.situ_linear_beta, cfg.group_mask) == ("situ", 4.0, 25.0, -math.inf)
        total = sum(math.prod(shape) for _, shape, _ in kimi_k3.tensor_specs(cfg))
        assert total == 2_779_484_478_208, total
    small = "/work/shared/data/kimi-k3-0.40b/config.json"
    if os.path.exists(small):
        with open(small) as f:
            cfg = kimi_k3.K3Config.from_json(_json.load(f))
        assert cfg.gate_lower_bound is None and cfg.quantization_format is None and cfg.attn_res_block_size == 4
    text_only = next(c for c in kimi_k3_goldens.CASES if c.name == "text_only").json_config()
    assert kimi_k3.K3Config.from_json(text_only).tensor_prefix == ""
    for bad in ({"q_lora_rank": None}, {"mla_use_nope": False}, {"attn_res_block_size": 0},
                {"routed_expert_hidden_size": None}, {"model_type": "deepseek_v3"}):
        try:
            kimi_k3.K3Config.from_json({**text_only, **bad})
        except ValueError:
            continue
        raise AssertionError(f"config {bad} was accepted")
    try:
        kimi_k3.K3Config.from_json({k: v for k, v in text_only.items() if k != "attn_res_block_size"})
        raise AssertionError("a config without attn_res_block_size was accepted")
    except ValueError:
        pass


def _qwen_case(case):
    """(cfg, checkpoint tensors, float64 weights, tokens) of a qwen golden case, without writing it."""
    cfg = qwen.QwenConfig.from_json(case.json_config())
    tokens = torch.from_numpy(case_tokens(case, cfg)).long()
    _, tensors = qwen_goldens.choose_seed(case, cfg, tokens)
    return cfg, tensors, qwen.canonical_weights(cfg, tensors, torch.float64), tokens


def _qwen_decode_reference(cfg, w, tokens, bf16_inputs=frozenset()):
    """Independent Qwen3-Next / Qwen3.5 decode, one token at a time, in the shape of the HF code (spec 3):
    fix_query_key_value_ordering's view-and-split, F.conv1d over a window of raw rows, the recurrence
    with repeat_interleave'd q/k heads, rotate_half RoPE on cat(freqs, freqs), torch.topk routing,
    F.linear everywhere (input rounded to bf16 when the weight is in bf16_inputs)."""
    def linear(x, name, e=None):
        x = x.to(torch.bfloat16).to(x.dtype) if name in bf16_inputs else x
        return F.linear(x, w[name] if e is None else w[name][e])

    def rms1p(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * (1 + w[name])

    def mlp(x, p):
        hidden = F.silu(linear(x, p + "gate_proj.weight")) * linear(x, p + "up_proj.weight")
        return linear(hidden, p + "down_proj.weight")

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)

    Hk, Hv, dk, dv, r = cfg.num_key_heads, cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim, cfg.gva_ratio
    nh, nkv, hd, R, K = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim, cfg.conv_kernel
    dtype = w["model.embed_tokens.weight"].dtype
    raws = [[torch.zeros(cfg.conv_dim, dtype=dtype)] * (K - 1) for _ in range(cfg.num_hidden_layers)]
    states = [torch.zeros(Hv, dk, dv, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
    kv = [([], []) for _ in range(cfg.num_hidden_layers)]
    rows = []
    for pos, tok in enumerate(tokens.tolist()):
        h = w["model.embed_tokens.weight"][tok]
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = rms1p(h, p + "input_layernorm.weight")
            if cfg.layer_types[i] == "linear_attention":
                a_ = p + "linear_attn."
                if cfg.family == "qwen3_next":
                    qkvz = linear(x, a_ + "in_proj_qkvz.weight").view(Hk, 2 * dk + 2 * r * dv)
                    q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
                    b, a = torch.split(linear(x, a_ + "in_proj_ba.weight").view(Hk, 2 * r), [r, r], dim=-1)
                    mixed = torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1)])
                else:
                    mixed, z = linear(x, a_ + "in_proj_qkv.weight"), linear(x, a_ + "in_proj_z.weight")
                    b, a = linear(x, a_ + "in_proj_b.weight"), linear(x, a_ + "in_proj_a.weight")
                z, b, a = z.reshape(Hv, dv), b.reshape(Hv), a.reshape(Hv)
                window = torch.stack(raws[i][len(raws[i]) - K + 1:] + [mixed], dim=1)          # [C, K]
                raws[i].append(mixed)
                mixed = F.silu(F.conv1d(window[None], w[a_ + "conv1d.weight"], groups=cfg.conv_dim)[0, :, 0])
                q, k, v = torch.split(mixed, [cfg.key_dim, cfg.key_dim, cfg.value_dim])
                q, k, v = q.view(Hk, dk), k.view(Hk, dk), v.view(Hv, dv)
                q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
                k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
                q, k = q.repeat_interleave(r, dim=0), k.repeat_interleave(r, dim=0)
                beta = torch.sigmoid(b)
                g = -w[a_ + "A_log"].exp() * F.softplus(a + w[a_ + "dt_bias"])
                S = states[i] * g.exp()[:, None, None]
                delta = (v - (S * k[:, :, None]).sum(-2)) * beta[:, None]
                S = S + k[:, :, None] * delta[:, None, :]
                states[i] = S
                o = (S * q[:, :, None]).sum(-2)                                                  # [Hv, dv]
                o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w[a_ + "norm.weight"]
                o = linear((o * F.silu(z)).reshape(-1), a_ + "out_proj.weight")
            else:
                a_ = p + "self_attn."
                q, gate = torch.chunk(linear(x, a_ + "q_proj.weight").view(nh, 2 * hd), 2, dim=-1)
                q = rms1p(q, a_ + "q_norm.weight")
                k = rms1p(linear(x, a_ + "k_proj.weight").view(nkv, hd), a_ + "k_norm.weight")
                v = linear(x, a_ + "v_proj.weight").view(nkv, hd)
                inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
                emb = torch.cat([pos * inv_freq, pos * inv_freq])
                cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
                q = torch.cat([q[:, :R] * cos + rotate_half(q[:, :R]) * sin, q[:, R:]], dim=-1)
                k = torch.cat([k[:, :R] * cos + rotate_half(k[:, :R]) * sin, k[:, R:]], dim=-1)
                kv[i][0].append(k)
                kv[i][1].append(v)
                keys = torch.stack(kv[i][0], 1).repeat_interleave(nh // nkv, dim=0)           # [nh, P, hd]
                values = torch.stack(kv[i][1], 1).repeat_interleave(nh // nkv, dim=0)
                probs = (torch.einsum("hd,hpd->hp", q, keys) / math.sqrt(hd)).softmax(-1)
                ctx = torch.einsum("hp,hpd->hd", probs, values).reshape(-1)
                o = linear(ctx * torch.sigmoid(gate.reshape(-1)), a_ + "o_proj.weight")
            h = h + o
            m = rms1p(h, p + "post_attention_layernorm.weight")
            mp = p + "mlp."
            if cfg.ffn_kind(i) == "dense":
                f = mlp(m, mp)
            else:
                top_v, top_i = torch.topk(linear(m, mp + "gate.weight").softmax(-1), cfg.num_experts_per_tok)
                if cfg.norm_topk_prob:
                    top_v = top_v / top_v.sum()
                f = torch.sigmoid(linear(m, mp + "shared_expert_gate.weight")) * mlp(m, mp + "shared_expert.")
                for weight, e in zip(top_v, top_i.tolist()):
                    if cfg.fused_experts:
                        gate_, up = linear(m, mp + "experts.gate_up_proj", e).chunk(2, dim=-1)
                        f = f + weight * linear(F.silu(gate_) * up, mp + "experts.down_proj", e)
                    else:
                        f = f + weight * mlp(m, f"{mp}experts.{e}.")
            h = h + f
        y = rms1p(h, "model.norm.weight")
        rows.append(linear(y, "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"))
    return torch.stack(rows)


def test_qwen_matches_independent_decode():
    """Every qwen case: the independent HF-shaped decode equals qwen_forward's prefill (bf16 inputs too),
    and qwen_forward itself fed one token at a time through its cache (S, conv tails, KV) equals it."""
    for case in qwen_goldens.CASES:
        cfg, tensors, w, tokens = _qwen_case(case)
        runs = [frozenset()]
        if case.weights_dtype == "BF16":
            runs.append(qwen.bf16_weight_names(cfg, tensors))
        for bf16 in runs:
            label = f"{case.family}/{case.name}{' (bf16 inputs)' if bf16 else ''}"
            prefill = qwen.qwen_forward(cfg, w, tokens, bf16_inputs=bf16)
            err = relative_rms(_qwen_decode_reference(cfg, w, tokens, bf16), prefill)
            assert err < 1e-10, f"{label}: independent decode vs prefill relative RMS {err:.3g}"
            decode = _cached_decode(qwen.qwen_forward, qwen.initial_cache(cfg, torch.float64), cfg, w, tokens,
                                    bf16_inputs=bf16)
            err = relative_rms(decode, prefill)
            assert err < 1e-12, f"{label}: cached decode vs prefill relative RMS {err:.3g}"


def test_qwen_gdn_matches_chunked_form():
    """qwen.gdn_recurrent (value head j reads key head j // r) equals the chunked form of spec 1.6 (chunks of
    4, as TF's test_gdn_chunked_matches_recurrent) on repeated q/k heads and delta_family's recurrence, from
    zero and from a random state, at 3, 12 and 13 tokens."""
    gen = torch.Generator().manual_seed(36)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    Hk, r, dk, dv = 2, 3, 5, 4
    Hv = Hk * r
    for T in (3, 12, 13):
        q = delta_family.l2_normalize(rand(T, Hk, dk)) * dk ** -0.5
        k = delta_family.l2_normalize(rand(T, Hk, dk))
        v, beta = rand(T, Hv, dv), torch.sigmoid(rand(T, Hv))
        g = -torch.exp(rand(Hv)) * F.softplus(rand(T, Hv))
        for S0 in (torch.zeros(Hv, dk, dv, dtype=torch.float64), rand(Hv, dk, dv)):
            o, S = qwen.gdn_recurrent(q, k, v, beta, g, S0, torch.arange(Hv) // r)
            qr, kr = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
            want_o, want_S = _chunked_gated_delta(qr, kr, v, beta, g[:, :, None].expand(T, Hv, dk), S0, C=4)
            err = max(relative_rms(o, want_o), relative_rms(S, want_S))
            assert err < 1e-10, f"T={T}: qwen recurrence vs chunked form {err:.3g}"
            want_o, want_S = delta_family.gated_delta_recurrent(qr, kr, v, beta, g, S0)
            err = max(relative_rms(o, want_o), relative_rms(S, want_S))
            assert err < 1e-12, f"T={T}: qwen recurrence vs delta_family {err:.3g}"


def _as_qwen35_moe(cfg, w):
    """A qwen3_next model's weights in qwen3_5_moe's layout (spec 7's twin): in_proj_qkvz / in_proj_ba
    de-interleaved into in_proj_qkv / _z / _b / _a, the per-expert tensors fused into gate_up_proj
    [E, 2I, D] (gate rows first) and down_proj [E, D, I]."""
    Hk, r, dk, dv = cfg.num_key_heads, cfg.gva_ratio, cfg.key_head_dim, cfg.value_head_dim
    out = {}
    for name, t in w.items():
        if name.endswith("in_proj_qkvz.weight"):
            g = t.reshape(Hk, 2 * dk + 2 * r * dv, -1)
            p = name[:-len("in_proj_qkvz.weight")]
            out[p + "in_proj_qkv.weight"] = torch.cat([g[:, :dk].flatten(0, 1), g[:, dk:2 * dk].flatten(0, 1),
                                                       g[:, 2 * dk:2 * dk + r * dv].flatten(0, 1)])
            out[p + "in_proj_z.weight"] = g[:, 2 * dk + r * dv:].flatten(0, 1)
        elif name.endswith("in_proj_ba.weight"):
            g = t.reshape(Hk, 2 * r, -1)
            p = name[:-len("in_proj_ba.weight")]
            out[p + "in_proj_b.weight"], out[p + "in_proj_a.weight"] = g[:, :r].flatten(0, 1), g[:, r:].flatten(0, 1)
        elif ".mlp.experts." in name:
            p, rest = name.split(".experts.")
            e, proj = rest.split(".", 1)
            if e == "0" and proj == "gate_proj.weight":
                E = cfg.num_experts
                out[p + ".experts.gate_up_proj"] = torch.stack(
                    [torch.cat([w[f"{p}.experts.{j}.gate_proj.weight"], w[f"{p}.experts.{j}.up_proj.weight"]])
                     for j in range(E)])
                out[p + ".experts.down_proj"] = torch.stack([w[f"{p}.experts.{j}.down_proj.weight"] for j in range(E)])
        else:
            out[name] = t
    return out


def test_qwen_next_matches_qwen35_twin():
    """qwen3_next/f32_sharded re-laid out as qwen3_5_moe (de-interleaved projections, fused experts; spec 7)
    gives the same logits: the two families' projection and expert layouts describe the same model."""
    case = next(c for c in qwen_goldens.CASES if (c.family, c.name) == ("qwen3_next", "f32_sharded"))
    cfg, _, w, tokens = _qwen_case(case)
    twin_cfg = dataclasses.replace(cfg, family="qwen3_5_moe")
    twin = _as_qwen35_moe(cfg, w)
    assert sorted(twin) == sorted(name for name, _, _ in qwen.tensor_specs(twin_cfg))
    err = relative_rms(qwen.qwen_forward(twin_cfg, twin, tokens), qwen.qwen_forward(cfg, w, tokens))
    assert err < 1e-13, f"qwen3_5_moe twin vs qwen3_next logits relative RMS {err:.3g}"


def test_qwen_config():
    """RoPE parameters top level or nested (conflicts raise), layer_types derived from
    full_attention_interval, the MoE placement rule, tie_word_embeddings at either level, and refusals."""
    next_cfg = qwen_goldens.NEXT_CONFIG
    cfg = qwen.QwenConfig.from_json(next_cfg)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) and cfg.rotary_dim == 8
    nested = {k: v for k, v in next_cfg.items() if k not in ("rope_theta", "partial_rotary_factor")}
    nested["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}
    assert qwen.QwenConfig.from_json(nested) == cfg
    no_prf = {k: v for k, v in next_cfg.items() if k != "partial_rotary_factor"}
    assert qwen.QwenConfig.from_json(no_prf).partial_rotary_factor == 0.25
    eight = qwen.QwenConfig.from_json({**next_cfg, "num_hidden_layers": 8, "full_attention_interval": 2,
                                       "mlp_only_layers": [0], "decoder_sparse_step": 2})
    assert [eight.layer_kind(i) for i in range(8)] == ["gdn", "attention"] * 4
    assert [eight.ffn_kind(i) for i in range(8)] == ["dense", "moe"] * 4
    moe35 = next(c for c in qwen_goldens.CASES if c.family == "qwen3_5_moe").json_config()
    c35 = qwen.QwenConfig.from_json(moe35)
    assert c35.norm_topk_prob and c35.fused_experts and c35.prefix == "model.language_model."
    dense35 = next(c for c in qwen_goldens.CASES if c.family == "qwen3_5").json_config()
    assert qwen.QwenConfig.from_json(dense35).tie_word_embeddings
    bad_configs = [
        {**next_cfg, "rope_parameters": {"rope_theta": 1e6}},                 # conflicts with rope_theta 1e7
        {**next_cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        {**next_cfg, "layer_types": ["linear_attention"] * 3},
        {**next_cfg, "model_type": "qwen3_moe"},
        {k: v for k, v in next_cfg.items() if k != "head_dim"},
        {**moe35, "text_config": {**moe35["text_config"], "model_type": "qwen3_5_text"}},
        {**dense35, "tie_word_embeddings": False},                            # text_config says true
        {**moe35, "text_config": {**moe35["text_config"], "rope_parameters": {
            **moe35["text_config"]["rope_parameters"], "mrope_section": [3, 1, 1]}}},
    ]
    for bad in bad_configs:
        try:
            qwen.QwenConfig.from_json(bad)
        except ValueError:
            continue
        raise AssertionError(f"config accepted: {bad}")


def _check_grad_dirs(out: str) -> None:
    """Every gradient case's grad/ (grad_goldens.GRAD_CASES, each family's list; cases and seeds unique) holds
    tokens [B, T + 1] < vocab and, between its manifest's tensors and no_grad, each checkpoint tensor exactly
    once, each gradient float32 in its stored shape, finite and not all zero."""
    import json as _json
    listed = [(f, g) for f, cases in grad_goldens.GRAD_CASES.items() for g in cases]
    assert len({(f, g.case) for f, g in listed}) == len({g.seed for _, g in listed}) == len(listed), listed
    for family, grad_case in listed:
        case_dir = os.path.join(out, family, grad_case.case)
        grad_dir = os.path.join(case_dir, grad_goldens.GRAD_DIR)
        with open(os.path.join(grad_dir, "manifest.json")) as f:
            manifest = _json.load(f)
        stored = read_checkpoint(case_dir)
        assert (manifest["case"], manifest["B"], manifest["T"]) == (grad_case.case, grad_goldens.B, grad_goldens.T)
        tokens = np.load(os.path.join(grad_dir, "tokens.npy"))
        model, _ = grad_goldens.load_case(family, case_dir)
        assert tokens.dtype == np.int32 and tokens.shape == (grad_goldens.B, grad_goldens.T + 1), family
        assert 0 <= tokens.min() and tokens.max() < model.vocab_size, family
        names = [e["name"] for e in manifest["tensors"]] + [e["name"] for e in manifest["no_grad"]]
        assert sorted(names) == sorted(stored), f"{family}: manifest names differ from the checkpoint's"
        assert all(e["reason"] for e in manifest["no_grad"]), family
        for e in manifest["tensors"]:
            g = np.load(os.path.join(grad_dir, e["file"]))
            assert g.dtype == np.float32 and list(g.shape) == e["shape"] == list(stored[e["name"]].shape), e
            assert np.isfinite(g).all() and (g != 0).any() and e["f32_torch_rel_rms"] < 1e-3, e
        assert sorted(os.listdir(grad_dir)) == sorted(["manifest.json", "tokens.npy"] +
                                                      [e["file"] for e in manifest["tensors"]]), family


def test_goldens_bit_identical():
    # Against the suite's own goldens where ctest gives them (LINEAGE_TESTDATA, the fixtures' output),
    # else against a second run.
    given = os.environ.get("LINEAGE_TESTDATA")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as second:
        b = given if given and os.path.isdir(given) else second
        for out in (a,) if b == given else (a, b):
            subprocess.run([sys.executable, os.path.join(HERE, "make_goldens.py"), "--out", out],
                           check=True, stdout=subprocess.DEVNULL)
        _check_grad_dirs(a)
        for root, _, files in os.walk(a):
            for name in files:
                left = os.path.join(root, name)
                right = os.path.join(b, os.path.relpath(left, a))
                assert filecmp.cmp(left, right, shallow=False), f"re-run differs: {left}"


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print(f"ok {name}")
