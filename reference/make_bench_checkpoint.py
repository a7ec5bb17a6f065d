"""Writes a benchmark-sized checkpoint in the real format (an HF model directory: config.json +
model.safetensors) with seeded random weights, for `lineage bench --model DIR`: the weights mapped from
a file as a downloaded checkpoint's are, tensors wherever the safetensors header leaves them.

Run with the system interpreter (it has torch):
  /usr/bin/python3 reference/make_bench_checkpoint.py --out DIR --model gpt2-124m --dtype BF16
  /usr/bin/python3 reference/make_bench_checkpoint.py --out DIR --model kda-head128 --dtype BF16
  /usr/bin/python3 reference/make_bench_checkpoint.py --out DIR --model gated-deltanet-head256

The weights follow the golden cases' initialisation (gpt2_goldens / delta_family_goldens), so the
models compute finite, non-degenerate activations; nothing is checked against the reference here."""

import argparse
import sys

import torch

import delta_family_goldens as fla
import gpt2_goldens as g2
from delta_family import FlaConfig
from gpt2 import GPT2Config

MODELS = {
    # GPT-2 small's shapes (openai-community/gpt2), tied embeddings, the tanh GELU.
    "gpt2-124m": lambda dtype: g2.GPT2Case(
        "bench", GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                            activation_function="gelu_new"), T=0, seed=7, weights_dtype=dtype),
    # Kimi Linear's KDA head (K = V = 128) in a model of GPT-2 medium's width: D = 1024, 8 heads, 12 layers.
    "kda-head128": lambda dtype: fla._case("kda", "bench", 7, dtype, hidden_size=1024, num_heads=8,
                                           head_dim=128, num_hidden_layers=12, vocab_size=32000),
    # flash-linear-attention's Gated DeltaNet head (K = 256, V = 512) at the same width: 4 heads.
    "gated-deltanet-head256": lambda dtype: fla._case("gated_deltanet", "bench", 7, dtype, hidden_size=1024,
                                                      num_heads=4, head_dim=256, expand_v=2.0, use_gate=True,
                                                      num_hidden_layers=12, vocab_size=32000),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--dtype", default="BF16", choices=["F32", "BF16"], help="weights dtype")
    args = parser.parse_args()
    case = MODELS[args.model](args.dtype)
    gen = torch.Generator().manual_seed(case.seed)
    if isinstance(case, g2.GPT2Case):
        tensors = g2.checkpoint_tensors(case, g2.init_params(case.config, gen))
        g2.write_model_dir(case, args.out, tensors)
    else:
        cfg = FlaConfig.from_json(case.json_config())
        tensors = fla.checkpoint_tensors(case, fla.init_params(cfg, gen))
        fla.write_model_dir(case, args.out, tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"{args.out}: {args.model} {args.dtype}, {len(tensors)} tensors, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
