#!/usr/bin/env python3
"""Writes a synthetic checkpoint at a published MoE config's real shapes, for the expert-streaming
benchmark (scripts/bench-streaming.sh, docs/streaming.md): the config as published (optionally cut to
its first N layers, the layer lists and the quantization config kept consistent) and every tensor
lineage reads of it (`lineage info --tensors --json` on the config alone: names, dtypes, shapes as the
checkpoint stores them), with seeded random values:

  - MXFP4 experts (`weight_packed` / `weight_scale`, U8): random e2m1 codes, E8M0 exponents 118 .. 124;
  - BF16 / F32 weights N(0, 0.02); norms 1; KDA's A_log log(U(1, 16)), dt_bias and biases 0.

Sharded safetensors (at most 4 GiB a shard) and model.safetensors.index.json, written a tensor at a
time. Nothing here is a reference: the values only keep the activations finite.

  /usr/bin/python3 scripts/make-stream-checkpoint.py --config CONFIG.json --out DIR [--layers N]
      [--lineage build/lineage] [--mxfp4-experts]
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

SHARD = 4 << 30
DTYPES = {"U8": (np.uint8, 1), "BF16": (np.uint16, 2), "F32": (np.float32, 4), "I64": (np.int64, 8),
          "I32": (np.int32, 4), "F16": (np.float16, 2)}

# compressed-tensors' MXFP4 scheme as Kimi K3 publishes it, for the routed experts alone.
MXFP4 = {"config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "input_activations": None,
                                       "output_activations": None, "targets": ["Linear"],
                                       "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                                   "group_size": 32, "num_bits": 4, "observer": "minmax",
                                                   "observer_kwargs": {}, "scale_dtype": "torch.uint8",
                                                   "strategy": "group", "symmetric": True, "type": "float",
                                                   "zp_dtype": None}}},
         "format": "mxfp4-pack-quantized", "global_compression_ratio": None,
         "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                    "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
         "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def cut_layers(cfg: dict, n: int) -> None:
    """Keeps the first n layers: the layer count, the 1-based layer lists of linear_attn_config, K3's
    attention-residual block size."""
    text = cfg.get("text_config", cfg)
    text["num_hidden_layers"] = n
    if "attn_res_block_size" in text:  # K3's Block Attention Residuals: blocks of at most n layers
        text["attn_res_block_size"] = min(text["attn_res_block_size"], n)
    lac = text.get("linear_attn_config")
    if lac:
        for key in ("kda_layers", "full_attn_layers"):
            if key in lac:
                lac[key] = [i for i in lac[key] if i <= n]


def values(name: str, dtype: str, shape: list, rng: np.random.Generator) -> bytes:
    n = int(np.prod(shape)) if shape else 1
    if dtype == "U8":
        if name.endswith("weight_scale"):
            return (np.frombuffer(rng.bytes(n), np.uint8) % 7 + 118).astype(np.uint8).tobytes()
        return rng.bytes(n)
    if dtype in ("I64", "I32"):
        return np.zeros(n, DTYPES[dtype][0]).tobytes()
    base = name.rsplit(".", 1)[0]
    if "norm" in base and name.endswith("weight"):
        x = np.ones(n, np.float32)
    elif name.endswith("A_log"):
        x = np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
    elif name.endswith("bias") or name.endswith("dt_bias"):
        x = np.zeros(n, np.float32)
    else:
        x = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float32)
    if dtype == "F32":
        return x.tobytes()
    if dtype == "F16":
        return x.astype(np.float16).tobytes()
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # BF16, truncated


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--lineage", default="build/lineage")
    ap.add_argument("--mxfp4-experts", action="store_true", help="add K3's MXFP4 quantization_config")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    if a.layers:
        cut_layers(cfg, a.layers)
    if a.mxfp4_experts:
        cfg.get("text_config", cfg)["quantization_config"] = MXFP4
        cfg.pop("quantization_config", None) if "text_config" in cfg else None
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    listing = subprocess.run([a.lineage, "info", "--tensors", "--json", "--model", a.out], check=True,
                             capture_output=True, text=True).stdout
    tensors = json.loads(listing)
    shards, cur, size = [], [], 0
    for t in tensors:
        b = int(np.prod(t["shape"])) * DTYPES[t["dtype"]][1] if t["shape"] else DTYPES[t["dtype"]][1]
        if cur and size + b > SHARD:
            shards.append(cur)
            cur, size = [], 0
        cur.append((t, b))
        size += b
    if cur:
        shards.append(cur)
    rng = np.random.default_rng(40)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, at = {}, 0
        for t, b in shard:
            header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [at, at + b]}
            at += b
            weight_map[t["name"]] = fname
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for t, b in shard:
                data = values(t["name"], t["dtype"], t["shape"], rng)
                assert len(data) == b, t["name"]
                f.write(data)
        total += at
        print(f"{fname}: {len(shard)} tensors, {at / 2**30:.2f} GiB", file=sys.stderr)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    print(f"{a.out}: {len(tensors)} tensors, {total / 2**30:.2f} GiB in {len(shards)} shards", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
