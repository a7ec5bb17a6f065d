"""Logits of a checkpoint directory as the PyTorch reference computes them (float64): the check that a
checkpoint `lineage train` wrote loads outside lineage. Usage:
  /usr/bin/python3 reference/checkpoint_logits.py MODEL_DIR TOKENS.npy OUT.npy
TOKENS.npy: int32 [T]; OUT.npy: float32 [T, vocab]."""
import json
import os
import sys

import numpy as np
import torch

import gpt2
from safetensors_io import read_safetensors


def main() -> int:
    model_dir, tokens_file, out_file = sys.argv[1:4]
    config = json.load(open(os.path.join(model_dir, "config.json")))
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    tokens = torch.from_numpy(np.load(tokens_file).astype(np.int64))
    if config["model_type"] != "gpt2":
        raise SystemExit(f"{model_dir}: model_type {config['model_type']!r}: only gpt2 checkpoints are read here")
    cfg = gpt2.GPT2Config.from_json(config)
    w = gpt2.canonical_weights(cfg, {n: t.to(torch.float64) for n, t in tensors.items()}, torch.float64)
    logits = gpt2.gpt2_forward(cfg, w, tokens)
    np.save(out_file, logits.to(torch.float32).numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
