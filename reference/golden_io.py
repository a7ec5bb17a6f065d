"""Shared by every golden-data family: the error metric and the golden/ directory layout
(tokens.npy int32 [T], one float32 little-endian C-order .npy per intermediate, manifest.json; BF16 cases
add logits_bf16_dot.npy, which the manifest does not list)."""

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


def write_array(golden_dir: str, name: str, t: torch.Tensor) -> tuple:
    """Writes t as golden_dir/<name>.npy, float32 little-endian C order. Returns (file name, shape)."""
    array = np.ascontiguousarray(t.detach().cpu().numpy(), dtype="<f4")
    file = f"{name}.npy"
    np.save(os.path.join(golden_dir, file), array)
    return file, list(array.shape)


# Rounding every BF16 linear's input to bf16 (2^-9 relative) moves these cases' logits by ~1e-3..1e-2
# relative RMS; outside this range the emulation did not round, or rounded something else.
BF16_DOT_RANGE = (1e-4, 5e-2)
BF16_DOT_FILE = "logits_bf16_dot"


def write_bf16_dot_logits(golden_dir: str, label: str, forward, tokens: torch.Tensor, exact: torch.Tensor,
                          dot_range: tuple = BF16_DOT_RANGE) -> float:
    """Writes golden_dir/logits_bf16_dot.npy: forward(tokens), the logits [T, vocab] with the engine's
    bf16 dot products emulated. Raises unless they are causal (forward of the first T/2 tokens gives the
    same first rows) and lie dot_range (BF16_DOT_RANGE unless a family needs its own) from the exact
    logits. Returns that distance (relative RMS)."""
    logits, prefix_logits = forward(tokens), forward(tokens[:tokens.shape[0] // 2])
    causal_err = relative_rms(prefix_logits, logits[:prefix_logits.shape[0]])
    if causal_err > 1e-12:
        raise AssertionError(f"{label}: bf16-dot logits of the first {prefix_logits.shape[0]} tokens change "
                             f"with later tokens (relative RMS {causal_err:.3g})")
    err = relative_rms(logits, exact)
    lo, hi = dot_range
    if not lo < err < hi:
        raise AssertionError(f"{label}: bf16-dot logits lie {err:.3g} relative RMS from the exact ones, "
                             f"expected {lo:g}..{hi:g}")
    write_array(golden_dir, BF16_DOT_FILE, logits)
    return err


def bf16_dot_golden(golden_dir: str, label: str, weights_dtype: str, forward, tokens: torch.Tensor,
                    exact: torch.Tensor, dot_range: tuple = BF16_DOT_RANGE) -> str:
    """For a BF16 case, write_bf16_dot_logits with forward(tokens, bf16_inputs) and the note for the case's
    summary line; nothing and "" for other weight dtypes."""
    if weights_dtype != "BF16":
        return ""
    err = write_bf16_dot_logits(golden_dir, label, forward, tokens, exact, dot_range)
    return f", bf16-dot logits {err:.1e} from exact"


def write_golden(golden_dir: str, tokens: np.ndarray, intermediates: dict, manifest: dict,
                 per_name: dict = None) -> None:
    """Writes tokens.npy, <name>.npy for each intermediate (dict order = forward order) and
    manifest.json = manifest + {"tokens": ..., "intermediates": [{name, file, shape, dtype, ...per_name}]}."""
    os.makedirs(golden_dir, exist_ok=True)
    np.save(os.path.join(golden_dir, "tokens.npy"), np.ascontiguousarray(tokens, dtype="<i4"))
    entries = []
    for name, t in intermediates.items():
        file, shape = write_array(golden_dir, name, t)
        entry = {"name": name, "file": file, "shape": shape, "dtype": "float32"}
        entry.update((per_name or {}).get(name, {}))
        entries.append(entry)
    token_entry = {"file": "tokens.npy", "shape": [int(tokens.shape[0])], "dtype": "int32"}
    # One tensor per line keeps the manifest readable; json.load does not care.
    head = json.dumps(manifest, indent=2)[:-2]
    body = ",\n".join("    " + json.dumps(e) for e in entries)
    with open(os.path.join(golden_dir, "manifest.json"), "w") as f:
        f.write(f'{head},\n  "tokens": {json.dumps(token_entry)},\n'
                f'  "intermediates": [\n{body}\n  ]\n}}\n')


def recorder(record):
    """rec(name, t) for a forward's named intermediates: stores t under name when record is a dict (in
    forward order) and returns t."""
    def rec(name, t):
        if record is not None:
            record[name] = t
        return t
    return rec
