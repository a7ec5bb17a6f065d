"""Shared by every golden-data family: the error metric, the golden/ directory layout (tokens.npy int32
[T], one float32 little-endian C-order .npy per intermediate, manifest.json; BF16 cases add
logits_bf16_dot.npy, which the manifest does not list), the case's model directory and tokens, and the
self-checks every family runs before writing (the contract, float32 agreement, causality, the split feed)."""

import json
import os

import numpy as np
import torch

from safetensors_io import read_checkpoint, write_safetensors, write_sharded


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


METRIC = "relative_rms = ||actual - expected||_2 / ||expected||_2"


def manifest_head(model: str, case, **fields) -> dict:
    """A golden manifest's fields for write_golden: model, case (case.name), weights_dtype
    (case.weights_dtype), compute_dtype float64, metric, T (case.T), then fields in order."""
    return {"model": model, "case": case.name, "weights_dtype": case.weights_dtype, "compute_dtype": "float64",
            "metric": METRIC, "T": case.T, **fields}


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


class FamilyCases:
    """A make_goldens.py family made of some of a module's cases: CASES and build_case(case, case_dir)."""

    def __init__(self, cases: list, build_case):
        self.CASES = cases
        self.build_case = build_case


def case_tokens(case, cfg) -> np.ndarray:
    """A case's tokens, int32 [case.T]: np.random.RandomState(case.seed) draws below cfg.vocab_size."""
    return np.random.RandomState(case.seed).randint(0, cfg.vocab_size, size=case.T).astype(np.int32)


def draw_params(specs: list, gen: torch.Generator, init_value) -> dict:
    """float32 parameters by name over specs [(name, shape, kind)], in order: for each, noise ~ N(0, 1) then
    uniform ~ U(0, 1) of its shape drawn from gen, and init_value(name, shape, kind, noise, uniform)."""
    out = {}
    for name, shape, kind in specs:
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        uniform = torch.rand(shape, generator=gen, dtype=torch.float32)
        out[name] = init_value(name, shape, kind, noise, uniform)
    return out


def write_model_dir(case_dir: str, config: dict, tensors: dict, shards: int = 1, indent: int = 2,
                    sort_keys: bool = False) -> None:
    """Writes an HF model directory: config.json (json.dump with indent and sort_keys, then a newline) and the
    tensors (metadata {"format": "pt"}) in model.safetensors, or with shards > 1 in
    model-0000k-of-0000N.safetensors + model.safetensors.index.json."""
    os.makedirs(case_dir, exist_ok=True)
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=indent, sort_keys=sort_keys)
        f.write("\n")
    if shards > 1:
        write_sharded(case_dir, tensors, shards, {"format": "pt"})
    else:
        write_safetensors(os.path.join(case_dir, "model.safetensors"), tensors, {"format": "pt"})


def read_model_dir(case_dir: str) -> tuple:
    """(config.json as a dict, every checkpoint tensor by name) of a model directory: what the C++ side reads."""
    with open(os.path.join(case_dir, "config.json")) as f:
        config = json.load(f)
    return config, read_checkpoint(case_dir)


def check_contract(label: str, record: dict, expected: list) -> None:
    """Raises unless the recorded intermediates' names and shapes, in order, are expected [(name, shape)]."""
    got = [(name, list(t.shape)) for name, t in record.items()]
    if got != expected:
        raise AssertionError(f"{label}: recorded intermediates {got} differ from {expected}")


def f32_errors(label: str, rec32: dict, rec64: dict, tol: float) -> tuple:
    """({name: relative RMS of the float32 run's intermediate against float64's}, the worst name). Raises
    where float32 selects other experts (a "moe.expert_ids" differs) or an error exceeds tol."""
    for name in rec64:
        if name.endswith("moe.expert_ids") and not torch.equal(rec32[name].double(), rec64[name]):
            raise AssertionError(f"{label}: float32 selects other experts than float64 at '{name}'")
    errors = {name: relative_rms(rec32[name], rec64[name]) for name in rec64}
    worst = max(errors, key=errors.get)
    if errors[worst] > tol:
        raise AssertionError(f"{label}: float32 vs float64 relative RMS {errors[worst]:.3g} at '{worst}' "
                             f"exceeds {tol}")
    return errors, worst


def f32_manifest_entries(errors: dict) -> dict:
    """write_golden's per_name for f32_errors' errors: {name: {"f32_torch_rel_rms": err, 4 digits}}."""
    return {name: {"f32_torch_rel_rms": float(f"{e:.3e}")} for name, e in errors.items()}


def check_causal(label: str, prefix_logits: torch.Tensor, logits: torch.Tensor, tol: float) -> None:
    """Raises unless the logits of the first tokens alone (prefix_logits) are the first rows of logits."""
    half = prefix_logits.shape[0]
    err = relative_rms(prefix_logits, logits[:half])
    if err > tol:
        raise AssertionError(f"{label}: logits of the first {half} tokens change with later tokens "
                             f"(relative RMS {err:.3g} > {tol})")


def check_split(label: str, checks: list, half: int, T: int, tol: float) -> float:
    """checks: (what, after feeding half + T - half tokens, one-shot). Raises where they differ by more than
    tol; returns the largest relative RMS."""
    worst = 0.0
    for what, split, one_shot in checks:
        err = relative_rms(split, one_shot)
        worst = max(worst, err)
        if err > tol:
            raise AssertionError(f"{label}: {what} after feeding {half} + {T - half} tokens differs "
                                 f"from the one-shot run (relative RMS {err:.3g} > {tol})")
    return worst


def layers_summary(cfg, mixer_letters: dict) -> str:
    """For a summary line: each layer's mixer letter (mixer_letters[cfg.layer_kind(i)]), "/", each layer's FFN
    (d: cfg.ffn_kind(i) "dense", e: MoE)."""
    layers = range(cfg.num_hidden_layers)
    return ("".join(mixer_letters[cfg.layer_kind(i)] for i in layers) + "/"
            + "".join("d" if cfg.ffn_kind(i) == "dense" else "e" for i in layers))
