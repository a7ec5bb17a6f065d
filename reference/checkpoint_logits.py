"""Logits of a checkpoint directory as the PyTorch reference computes them (float64): the check that a
checkpoint `lineage train` wrote loads outside lineage. Any family the reference implements: GPT-2, the
flash-linear-attention models, Kimi Linear, Kimi K3 (published kimi_k3 layout, or kimi_linear with K3's
fields), and Qwen3-Next, Qwen3.5 and Qwen3.5-MoE in their published layouts. Usage:
  /usr/bin/python3 reference/checkpoint_logits.py MODEL_DIR TOKENS.npy OUT.npy
TOKENS.npy: int32 [T]; OUT.npy: float32 [T, vocab]."""
import json
import os
import sys

import numpy as np
import torch

import delta_family
import qwen
from grad_goldens import make_model
from safetensors_io import read_checkpoint


def family_of(config: dict) -> str:
    """The reference family a config.json belongs to."""
    model_type = config.get("model_type")
    if model_type == "kimi_k3" or (model_type == "kimi_linear" and "routed_expert_hidden_size" in config):
        return "kimi_k3"
    if model_type in ("gpt2", "kimi_linear") or model_type in delta_family.MODEL_TYPES or model_type in qwen.FAMILIES:
        return model_type
    raise SystemExit(f"config.json: model_type {model_type!r} is not a family the reference implements")


def main() -> int:
    model_dir, tokens_file, out_file = sys.argv[1:4]
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    model = make_model(family_of(config), config)
    w = model.canonical(read_checkpoint(model_dir), torch.float64)
    tokens = torch.from_numpy(np.load(tokens_file).astype(np.int64))
    with torch.no_grad():
        logits = model.forward(w, tokens, None)
    np.save(out_file, logits.to(torch.float32).numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
