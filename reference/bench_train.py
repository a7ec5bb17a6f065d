"""PyTorch's training speed on this machine, for `lineage bench-train --pytorch`: the same model shape
(a GPT-2 config.json), nanoGPT-style code (nn.Linear, a masked softmax attention, GELU tanh, tied head,
torch.optim.AdamW), float32, `--threads` intra-op threads. Prints one JSON line:
{"tokens_per_s": ..., "step_s": ..., "loss": ..., "torch": version}.
Usage: /usr/bin/python3 reference/bench_train.py CONFIG.json --batch B --seq-len T --steps N --threads K"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    if c["model_type"] != "gpt2":
        raise SystemExit(f"{a.config}: only gpt2 configs are benchmarked in PyTorch here")
    model = GPT(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    data = torch.randint(0, c["vocab_size"], (a.batch, a.seq_len + 1))
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
