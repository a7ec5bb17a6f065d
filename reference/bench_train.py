"""PyTorch's training speed on this machine, for `lineage bench-train --pytorch`: the model of a config.json in
plain PyTorch, float32, `--threads` intra-op threads; a step is the forward, the cross-entropy, autograd's
backward and torch.optim.AdamW. Prints one JSON line: {"tokens_per_s": ..., "step_s": ..., "loss": ...,
"torch": version} (tokens_per_s and step_s from the best of --steps steps after one warm-up step).

gpt2: nanoGPT-style code (nn.Linear, a masked softmax attention, GELU tanh, tied head).

linear_attn, delta_net, gated_deltanet, kda (flash-linear-attention config.json, fields and defaults as
delta_family.FlaConfig reads them): fla's model with delta_family.tensor_specs' parameters (the shapes lineage
builds for the config, so the same matrix FLOPs) as nn.Parameter, N(0, 0.02) matrices, embeddings and short
convs, unit norms, zero biases, A_log and dt_bias as fla initializes them. The layer math is delta_family's
(projections, feature maps, q/k norms, beta, the decay, the output norm and gate), over a batch; the short convs
are F.conv1d. lineage's own field "lineage_delta_rule": false (gated_deltanet only; the mamba2-decay preset)
makes the write additive, S <- e^a S + k v^T, and drops b_proj, as lineage's fla.cpp builds it. The token
mixer is chunked_mixer: flash-linear-attention's naive chunked ops (fla/ops/*/naive.py at bc3b101d), chunks
of 64, differentiated by autograd.
Usage: /usr/bin/python3 reference/bench_train.py CONFIG.json --batch B --seq-len T --steps N --threads K"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from delta_family import (NORMALIZER_EPS, NORM_QK_EPS, FlaConfig, Weights, _attnres, _feature_map, _log_decay,
                          _output_norm, attn_res_mix, l2_normalize, rms_norm, silu, tensor_specs)

CHUNK = 64       # fla's naive chunked ops' chunk size
INIT_STD = 0.02  # matrices, embeddings, short-conv taps


class Block(nn.Module):
    def __init__(self, d: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.heads)
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d, eps = c["n_embd"], c.get("layer_norm_epsilon", 1e-5)
        self.vocab_size = c["vocab_size"]
        self.wte, self.wpe = nn.Embedding(c["vocab_size"], d), nn.Embedding(c["n_positions"], d)
        self.h = nn.ModuleList(Block(d, c["n_head"], eps) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=eps)
        self.register_buffer("mask", torch.triu(torch.ones(c["n_positions"], c["n_positions"], dtype=torch.bool), 1))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------------------------------------------
# The delta-rule family

def chunked_mixer(q, k, v, beta=None, log_decay=None):
    """The token mixer of all four model types in fla's naive chunked form, on q, k [B, H, T, K] (q already
    scaled, q/k heads already repeated for GVA), v [B, H, T, V], beta [B, H, T] or None (the additive write of
    linear attention), log_decay a_t <= 0 None, [B, H, T] (per head) or [B, H, T, K] (per key channel). Returns
    o [B, H, T, V], the recurrence S_t = diag(e^{a_t}) S_{t-1} + k_t u_t^T, o_t = S_t^T q_t with
    u_t = beta_t (v_t - (diag(e^{a_t}) S_{t-1})^T k_t) (or u_t = v_t), S_0 = 0, from an empty state.

    T is padded with zeros to chunks of 64 (a zero k, v, beta, a leaves S unchanged). Per chunk (rows c, i),
    G = the chunk-local cumulative sum of a, Gamma_ci = e^{G_c - G_i} for i <= c (per channel for KDA):
        A_qk = tril(Q K^T * Gamma),   A_kk = strictly_lower(diag(beta) (K K^T * Gamma))
        (KDA: A_qk[c, i] = sum_d q_c[d] k_i[d] Gamma_ci[d], A_kk likewise, one column i at a time as fla's
        naive_chunk_kda builds them, over the rows c >= i only, so no exponent is positive)
        T_ut = (I + A_kk)^-1,   U = T_ut diag(beta) V,   W = T_ut diag(beta) (K * e^G)   (the UT transform)
    then chunk by chunk, with the state S entering the chunk:
        Vn = U - W S   (additive write: Vn = V),   O = (Q * e^G) S + A_qk Vn,
        S <- diag(e^{G_last}) S + (K * e^{G_last - G})^T Vn.
    These are fla's naive_chunk_linear_attn (no decay, no beta; its states are the same exclusive sums of the
    chunks' K^T V), naive_chunk_simple_gla (per-head decay, no beta), delta_rule_chunkwise (beta, no decay),
    naive_chunk_gated_delta_rule (beta, per-head decay) and naive_chunk_kda (beta, per-channel decay).
    fla's naive ops reach T_ut by forward substitution, one in-place row at a time; here it is one
    unit-lower-triangular solve against I (the same matrix, ~1e-7 apart in float32; autograd through the
    in-place rows costs ~10 s a layer at batch 8 x 512 here, the solve ~0.1 s)."""
    B, H, T, K = q.shape
    V, C = v.shape[-1], CHUNK
    pad = -T % C
    N = (T + pad) // C

    def chunks(x):  # [B, H, T, d] -> [B, H, N, C, d], zeros after T
        return F.pad(x, (0, 0, 0, pad)).reshape(B, H, N, C, x.shape[-1])

    q, k, v = chunks(q), chunks(k), chunks(v)
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    qk, kk = q @ k.transpose(-1, -2), k @ k.transpose(-1, -2)
    if log_decay is not None:
        G = chunks(log_decay if log_decay.dim() == 4 else log_decay[..., None]).cumsum(-2)  # [B, H, N, C, 1 or K]
        if G.shape[-1] == 1:
            gamma = ((G - G.transpose(-1, -2)) * lower).exp()  # exponents above the diagonal zeroed
            qk, kk = qk * gamma, kk * gamma
        else:
            columns_qk, columns_kk = [], []
            for i in range(C):
                e = (G[..., i:, :] - G[..., i:i + 1, :]).exp()  # Gamma_ci, rows c >= i
                k_i = k[..., i, :, None]
                columns_qk.append(F.pad(((q[..., i:, :] * e) @ k_i)[..., 0], (i, 0)))
                columns_kk.append(F.pad(((k[..., i:, :] * e) @ k_i)[..., 0], (i, 0)))
            qk, kk = torch.stack(columns_qk, dim=-1), torch.stack(columns_kk, dim=-1)
        k_last = k * (G[..., -1:, :] - G).exp()  # K * e^{G_last - G}
        decay_last = G[..., -1, :, None].exp()   # [B, H, N, 1 or K, 1]
        q = q * G.exp()
    qk = qk.masked_fill(~lower, 0)
    if beta is not None:
        beta = chunks(beta[..., None])
        eye = torch.eye(C)
        t_ut = torch.linalg.solve_triangular(torch.tril(beta * kk, -1) + eye, eye.expand(B, H, N, C, C), upper=False,
                                             unitriangular=True)
        u = t_ut @ (beta * v)
        w = t_ut @ (beta * (k if log_decay is None else k * G.exp()))
    S, out = q.new_zeros(B, H, K, V), []
    for n in range(N):
        vn = v[:, :, n] if beta is None else u[:, :, n] - w[:, :, n] @ S
        out.append(q[:, :, n] @ S + qk[:, :, n] @ vn)
        if log_decay is None:
            S = S + k[:, :, n].transpose(-1, -2) @ vn
        else:
            S = decay_last[:, :, n] * S + k_last[:, :, n].transpose(-1, -2) @ vn
    return torch.stack(out, dim=2).reshape(B, H, N * C, V)[:, :, :T]


def short_conv(x: torch.Tensor, weight: torch.Tensor, activate: bool) -> torch.Tensor:
    """fla ShortConvolution over a batch from empty tails: x [B, T, C], weight [C, 1, W];
    y_t = act(sum_j weight[:, 0, j] x_{t-W+1+j}) (delta_family.short_conv), as a depthwise F.conv1d."""
    W = weight.shape[-1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), weight, groups=x.shape[-1]).transpose(1, 2)
    return silu(y) if activate else y


def fla_mixer(cfg: FlaConfig, w: Weights, p: str, x: torch.Tensor, delta_rule: bool = True) -> torch.Tensor:
    """The attention layer of delta_family.linear_attention / delta_mixer over a batch, x [B, T, D] (after
    attn_norm) -> [B, T, D], with chunked_mixer for the recurrence; delta_rule False: gated_deltanet's additive
    write (no beta)."""
    B, T, D = x.shape
    H, HV, K, V = cfg.num_heads, cfg.v_heads, cfg.head_k_dim, cfg.head_v_dim
    if cfg.model_type == "linear_attn":
        group = H // cfg.kv_proj_heads
        q = w.linear(x, p + "q_proj.weight").reshape(B, T, H, K)
        k = w.linear(x, p + "k_proj.weight").reshape(B, T, H // group, K).repeat_interleave(group, dim=2)
        v = w.linear(x, p + "v_proj.weight").reshape(B, T, H // group, V).repeat_interleave(group, dim=2)
        q = _feature_map(cfg, w, p + "feature_map_q", q)
        k = _feature_map(cfg, w, p + "feature_map_k", k)
        if cfg.norm_q:
            q = q / (q.sum(dim=-1, keepdim=True) + NORM_QK_EPS)
        if cfg.norm_k:
            k = k / (k.sum(dim=-1, keepdim=True) + NORM_QK_EPS)
        q = q * K ** -0.5
        o = chunked_mixer(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        if cfg.norm_feature_map:
            o = o / ((q * k.cumsum(dim=1)).sum(dim=-1, keepdim=True) + NORMALIZER_EPS)
        o = rms_norm(o, w.get(p + "norm.weight"), cfg.norm_eps)
        return w.linear(o.reshape(B, T, H * V), p + "o_proj.weight")

    qk_silu = cfg.model_type != "delta_net" or cfg.qk_activation == "silu"
    heads = {}
    for c, n in (("q", H), ("k", H), ("v", HV)):
        raw = w.linear(x, f"{p}{c}_proj.weight")
        activate = qk_silu or c == "v"
        if cfg.conv_channels:
            raw = short_conv(raw, w[f"{p}{c}_conv1d.weight"], activate)
        elif activate:
            raw = silu(raw)
        heads[c] = raw.reshape(B, T, n, -1)
    q, k, v = heads["q"], heads["k"], heads["v"]
    if cfg.model_type == "delta_net" and cfg.qk_activation == "relu":
        q, k = torch.relu(q), torch.relu(k)
    elif cfg.model_type == "delta_net" and cfg.qk_activation == "elu":
        q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
    if cfg.model_type == "delta_net" and cfg.qk_norm == "sum":
        q, k = q / q.sum(dim=-1, keepdim=True), k / k.sum(dim=-1, keepdim=True)
    else:
        q, k = l2_normalize(q), l2_normalize(k)
    beta = None
    if delta_rule:
        use_beta = cfg.model_type != "delta_net" or cfg.use_beta
        beta = torch.sigmoid(w.linear(x, p + "b_proj.weight")) if use_beta else x.new_ones(B, T, HV)
        if cfg.allow_neg_eigval:
            beta = 2.0 * beta
        beta = beta.transpose(1, 2)
    a = _log_decay(cfg, w, p, x)
    if a is not None:
        a = a.reshape(B, T, HV, K).permute(0, 2, 1, 3) if cfg.decay_kind == "channel" else a.transpose(1, 2)
    group = HV // H
    q = q.repeat_interleave(group, dim=2) * K ** -0.5
    k = k.repeat_interleave(group, dim=2)
    o = chunked_mixer(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta, a).transpose(1, 2)
    o = _output_norm(cfg, w, p, x.reshape(B * T, D), o.reshape(B * T, HV, V))
    return w.linear(o.reshape(B, T, HV * V), p + "o_proj.weight")


def fla_logits(cfg: FlaConfig, w: Weights, idx: torch.Tensor, delta_rule: bool = True) -> torch.Tensor:
    """delta_family.fla_forward over a batch from empty states, idx [B, T] -> logits [B, T, vocab], its mixers
    as fla_mixer; the residual stream (and fla's Block AttnRes, with delta_family's _attnres) runs on the
    B*T tokens as rows."""
    B, T = idx.shape
    D, eps = cfg.hidden_size, cfg.norm_eps
    attnres = cfg.attnres_block_size is not None
    no_record = lambda name, t: t  # noqa: E731
    x = w["model.embeddings.weight"][idx.reshape(-1)]
    blocks = []  # AttnRes: the completed block sums; x is then the current partial sum
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = x
        if attnres:
            h, blocks, x = _attnres(cfg, w, p, "attn_res", blocks, x, 2 * i, no_record)
        a = rms_norm(h, w[p + "attn_norm.weight"], eps).reshape(B, T, D)
        o = fla_mixer(cfg, w, p + "attn.", a, delta_rule).reshape(B * T, D)
        x = o if x is None else x + o
        h = x
        if attnres:
            h, blocks, x = _attnres(cfg, w, p, "mlp_res", blocks, x, 2 * i + 1, no_record)
        m = rms_norm(h, w[p + "mlp_norm.weight"], eps)
        mo = w.linear(silu(w.linear(m, p + "mlp.gate_proj.weight")) * w.linear(m, p + "mlp.up_proj.weight"),
                      p + "mlp.down_proj.weight")
        x = mo if x is None else x + mo
    if attnres:
        x, _ = attn_res_mix(blocks + [x], w["model.res_norm.weight"], w["model.res_proj.weight"], eps)
    head = "model.embeddings.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    return w.linear(rms_norm(x, w["model.norm.weight"], eps), head).reshape(B, T, -1)


def fla_specs(cfg: FlaConfig, delta_rule: bool = True) -> list:
    """delta_family.tensor_specs, without b_proj for the additive write (delta_rule False)."""
    return [s for s in tensor_specs(cfg) if delta_rule or not s[0].endswith(".attn.b_proj.weight")]


def init_param(kind: str, shape: list) -> torch.Tensor:
    """A float32 parameter of a tensor_specs kind: N(0, 0.02) matrices, embeddings, conv taps and AttnRes
    pseudo-queries; ones for norm weights; zeros for biases; fla's A_log = log U(1, 16) and
    dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1] (lineage's presets.cpp custom_init)."""
    if kind == "norm_weight":
        return torch.ones(shape)
    if kind == "bias":
        return torch.zeros(shape)
    if kind == "A_log":
        return torch.log(1.0 + 15.0 * torch.rand(shape))
    if kind == "dt_bias":
        dt = torch.exp(math.log(1e-3) + torch.rand(shape) * (math.log(0.1) - math.log(1e-3)))
        return dt + torch.log(-torch.expm1(-dt))
    return INIT_STD * torch.randn(shape)


class FlaModel(nn.Module):
    """fla's *ForCausalLM for training: fla_specs' tensors as nn.Parameters (init_param), fla_logits."""

    def __init__(self, cfg: FlaConfig, delta_rule: bool = True):
        super().__init__()
        self.cfg, self.delta_rule, self.vocab_size = cfg, delta_rule, cfg.vocab_size
        specs = fla_specs(cfg, delta_rule)
        self.names = [name for name, _, _ in specs]
        self.params = nn.ParameterList(nn.Parameter(init_param(kind, shape)) for _, shape, kind in specs)

    def forward(self, idx, targets):
        logits = fla_logits(self.cfg, Weights(dict(zip(self.names, self.params))), idx, self.delta_rule)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_model(c: dict) -> nn.Module:
    """The model of a config.json (dict): GPT for gpt2, FlaModel for the delta-rule family."""
    if c.get("model_type") == "gpt2":
        return GPT(c)
    cfg = FlaConfig.from_json(c)
    return FlaModel(cfg, cfg.model_type != "gated_deltanet" or c.get("lineage_delta_rule", True))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = json.load(open(a.config))
    try:
        model = make_model(c)
    except ValueError as e:
        raise SystemExit(f"{a.config}: {e}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    data = torch.randint(0, model.vocab_size, (a.batch, a.seq_len + 1))
    times, loss = [], None
    for step in range(a.steps + 1):  # the first step warms up (allocations, first touches)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        if step:
            times.append(time.perf_counter() - t0)
    best = min(times)
    print(json.dumps({"tokens_per_s": a.batch * a.seq_len / best, "step_s": best, "loss": float(loss),
                      "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
