"""Checks of the reference itself: safetensors round trips, gpt2.py against an independent token-by-token
KV-cache decode built from torch.nn.functional, delta_family.py's building blocks against torch.nn.functional
and its recurrence against the chunked (WY) form of spec 1.6, decode against prefill for every delta-family
case (BF16 cases with the bf16 dot-product emulation too), and bit-identical golden re-runs.
Run: /usr/bin/python3 reference/test_reference.py   (also collectable by pytest)"""

import filecmp
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import delta_family  # noqa: E402
import delta_family_goldens  # noqa: E402
from golden_io import relative_rms  # noqa: E402
from gpt2 import bf16_weight_names, canonical_weights, gpt2_forward  # noqa: E402
from gpt2_goldens import CASES, checkpoint_tensors, init_params  # noqa: E402
from safetensors_io import read_checkpoint, read_header, read_safetensors, write_safetensors, write_sharded  # noqa: E402


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
    rows = []
    for pos, tok in enumerate(tokens.tolist()):
        x = w["wte.weight"][tok] + w["wpe.weight"][pos]
        for i in range(cfg.n_layer):
            p = f"h.{i}."
            a = F.layer_norm(x, (D,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.layer_norm_epsilon)
            qkv = linear(a, p + "attn.c_attn.weight", w[p + "attn.c_attn.bias"])
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
        tokens = torch.from_numpy(np.random.RandomState(case.seed).randint(0, cfg.vocab_size, case.T)).long()
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
    delta_family.gated_delta_recurrent (log_decay [T, HV, K] here; beta None = plain additive write)."""
    T, HV, K = q.shape
    o = torch.empty(v.shape, dtype=v.dtype)
    S = S.clone()
    for h in range(HV):
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
                Vn = X @ (b[:, None] * Vc) - Wf @ S[h]
            o[sl, h] = (Q * G.exp()) @ S[h] + P @ Vn
            S[h] = G[-1].exp()[:, None] * S[h] + (Kc * (G[-1] - G).exp()).T @ Vn
    return o, S


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


def test_delta_family_decode_matches_prefill():
    """One token at a time through the cache (conv tails, S, z) reproduces the prefill logits."""
    for case in delta_family_goldens.CASES:
        cfg = delta_family.FlaConfig.from_json(case.json_config())
        params = delta_family_goldens.init_params(cfg, torch.Generator().manual_seed(case.seed))
        tensors = delta_family_goldens.checkpoint_tensors(case, params)
        w = delta_family.canonical_weights(cfg, tensors, torch.float64)
        tokens = torch.from_numpy(np.random.RandomState(case.seed).randint(0, cfg.vocab_size, case.T)).long()
        bf16 = delta_family.bf16_weight_names(tensors)
        for inputs in ((frozenset(), bf16) if bf16 else (frozenset(),)):
            prefill = delta_family.fla_forward(cfg, w, tokens, bf16_inputs=inputs)
            cache = delta_family.initial_cache(cfg, torch.float64)
            decode = torch.cat([delta_family.fla_forward(cfg, w, tokens[t:t + 1], cache=cache, bf16_inputs=inputs)
                                for t in range(case.T)])
            err = relative_rms(decode, prefill)
            assert err < 1e-12, (f"{case.model_type}/{case.name}{' bf16 inputs' if inputs else ''}: decode vs "
                                 f"prefill relative RMS {err:.3g}")


def test_goldens_bit_identical():
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for out in (a, b):
            subprocess.run([sys.executable, os.path.join(HERE, "make_goldens.py"), "--out", out],
                           check=True, stdout=subprocess.DEVNULL)
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
