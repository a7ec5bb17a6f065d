"""Shared by every golden-data family: the error metric and the golden/ directory layout
(tokens.npy int32 [T], one float32 little-endian C-order .npy per intermediate, manifest.json)."""

import json
import os

import numpy as np
import torch


def relative_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected||_2 / ||expected||_2 over all elements, in float64 (the C++ tests' metric)."""
    a, e = actual.double(), expected.double()
    denom = float(e.pow(2).mean().sqrt())
    err = float((a - e).pow(2).mean().sqrt())
    return err / denom if denom > 0 else err


def write_golden(golden_dir: str, tokens: np.ndarray, intermediates: dict, manifest: dict,
                 per_name: dict = None) -> None:
    """Writes tokens.npy, <name>.npy for each intermediate (dict order = forward order) and
    manifest.json = manifest + {"tokens": ..., "intermediates": [{name, file, shape, dtype, ...per_name}]}."""
    os.makedirs(golden_dir, exist_ok=True)
    np.save(os.path.join(golden_dir, "tokens.npy"), np.ascontiguousarray(tokens, dtype="<i4"))
    entries = []
    for name, t in intermediates.items():
        array = np.ascontiguousarray(t.detach().cpu().numpy(), dtype="<f4")
        file = f"{name}.npy"
        np.save(os.path.join(golden_dir, file), array)
        entry = {"name": name, "file": file, "shape": list(array.shape), "dtype": "float32"}
        entry.update((per_name or {}).get(name, {}))
        entries.append(entry)
    token_entry = {"file": "tokens.npy", "shape": [int(tokens.shape[0])], "dtype": "int32"}
    # One tensor per line keeps the manifest readable; json.load does not care.
    head = json.dumps(manifest, indent=2)[:-2]
    body = ",\n".join("    " + json.dumps(e) for e in entries)
    with open(os.path.join(golden_dir, "manifest.json"), "w") as f:
        f.write(f'{head},\n  "tokens": {json.dumps(token_entry)},\n'
                f'  "intermediates": [\n{body}\n  ]\n}}\n')
