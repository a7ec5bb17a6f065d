"""Perplexity and KL-divergence statistics as llama.cpp's llama-perplexity defines them, from the PyTorch
reference (float64), for lineage's `perplexity` command to be held to. Usage:
  /usr/bin/python3 reference/perplexity.py MODEL_DIR TOKENS.bin CTX WINDOWS
      perplexity of the checkpoint over the windows: JSON {"ppl", "positions"}
  /usr/bin/python3 reference/perplexity.py --kld BASE.npy Q.npy TOKENS.bin CTX WINDOWS
      the statistics of two runs' saved log-softmax rows: JSON {"mean", "median", "p90", "p99", "max", "top1",
      "dp_mean", "dp_rms", "ppl_base", "ppl_q"}
TOKENS.bin: little-endian uint16 ids (lineage train's corpus format). The windows: the tokens cut into WINDOWS windows of CTX; in each, positions CTX//2 .. CTX-2 are scored, each
predicting the next token. Percentiles are numpy's default (linear interpolation)."""

import json
import os
import sys

import numpy as np
import torch

from checkpoint_logits import family_of
from grad_goldens import make_model
from safetensors_io import read_checkpoint


def read_bin(path: str) -> np.ndarray:
    return np.fromfile(path, dtype="<u2").astype(np.int64)


def scored(tokens: np.ndarray, ctx: int, windows: int):
    """(window index, position in the window, target) of every scored position, in order."""
    for w in range(windows):
        for j in range(ctx // 2, ctx - 1):
            yield w, j, int(tokens[w * ctx + j + 1])


def model_ppl(model_dir: str, tokens: np.ndarray, ctx: int, windows: int) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    model = make_model(family_of(config), config)
    w = model.canonical(read_checkpoint(model_dir), torch.float64)
    nll = []
    with torch.no_grad():
        for win in range(windows):
            window = torch.from_numpy(tokens[win * ctx:(win + 1) * ctx].astype(np.int64))
            logp = torch.log_softmax(model.forward(w, window, None), dim=-1)
            for j in range(ctx // 2, ctx - 1):
                nll.append(-float(logp[j, int(window[j + 1])]))
    return {"ppl": float(np.exp(np.mean(nll))), "positions": len(nll)}


def kld_stats(base_file: str, q_file: str, tokens: np.ndarray, ctx: int, windows: int) -> dict:
    base = np.load(base_file).astype(np.float64)
    q = np.load(q_file).astype(np.float64)
    targets = np.array([t for _, _, t in scored(tokens, ctx, windows)])
    assert base.shape == q.shape == (len(targets), base.shape[1])
    kld = np.sum(np.exp(base) * (base - q), axis=1)
    rows = np.arange(len(targets))
    dp = np.exp(q[rows, targets]) - np.exp(base[rows, targets])
    return {"mean": float(kld.mean()), "median": float(np.percentile(kld, 50)), "p90": float(np.percentile(kld, 90)),
            "p99": float(np.percentile(kld, 99)), "max": float(kld.max()),
            "top1": float(np.mean(base.argmax(axis=1) == q.argmax(axis=1))),
            "dp_mean": float(dp.mean()), "dp_rms": float(np.sqrt(np.mean(dp * dp))),
            "ppl_base": float(np.exp(-base[rows, targets].mean())), "ppl_q": float(np.exp(-q[rows, targets].mean()))}


def main() -> int:
    if sys.argv[1] == "--kld":
        base, q, tokens_file, ctx, windows = sys.argv[2:7]
        out = kld_stats(base, q, read_bin(tokens_file), int(ctx), int(windows))
    else:
        model_dir, tokens_file, ctx, windows = sys.argv[1:5]
        out = model_ppl(model_dir, read_bin(tokens_file), int(ctx), int(windows))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
