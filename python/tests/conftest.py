# Shared fixtures of the binding tests: the reference's test data (build/testdata, written by the
# reference_goldens and reference_tokenizer fixtures of tests/CMakeLists.txt) and a tiny GPT-2 with
# the real 50257-token vocabulary, written here as config.json + safetensors + tokenizer files.
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import lineage


def data_root() -> Path:
    # Missing data is a failure, not a skip: the ctest entry requires the fixtures that write it.
    root = os.environ.get("LINEAGE_TESTDATA")
    assert root, "LINEAGE_TESTDATA is not set (run through ctest -R python_bindings)"
    path = Path(root)
    assert path.is_dir(), f"LINEAGE_TESTDATA={root} does not exist; run reference/make_goldens.py --out {root}"
    return path


class Golden:
    """A reference case: its directory, golden token ids and the float64 reference's outputs."""

    def __init__(self, case: str):
        self.dir = data_root() / case
        self.manifest = json.loads((self.dir / "golden" / "manifest.json").read_text())
        self.items = {item["name"]: item for item in self.manifest["intermediates"]}
        self.tokens = [int(t) for t in np.load(self.dir / "golden" / "tokens.npy")]
        self.config = json.loads((self.dir / "config.json").read_text())

    def array(self, name: str) -> np.ndarray:
        return np.load(self.dir / "golden" / self.items[name]["file"])

    def tolerance(self, name: str) -> float:
        # As tests/golden_test.cpp: 6x PyTorch's own float32 error on this output, at least 2e-7.
        return max(6 * self.items[name]["f32_torch_rel_rms"], 2e-7)


def rel_rms(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    return float(np.linalg.norm((got - want).ravel()) / np.linalg.norm(want.ravel()))


def assert_close_to_golden(got, golden: Golden, name: str, want=None):
    want = golden.array(name) if want is None else want
    err, tol = rel_rms(got, want), golden.tolerance(name)
    if err > tol:
        worst = np.unravel_index(np.argmax(np.abs(np.asarray(got, np.float64) - want)), want.shape)
        pytest.fail(f"{golden.dir.name}: {name}: relative RMS {err:.3g} > tolerance {tol:.3g}; worst element "
                    f"{worst}: lineage {got[worst]} vs reference {want[worst]}")


def write_safetensors(path: Path, tensors: dict):
    """safetensors: an 8-byte little-endian header length, a JSON header, then the raw data."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


GPT2_VOCAB, GPT2_EOS = 50257, 50256


def write_tiny_gpt2(dir: Path, seed: int, always_eos: bool = False) -> Path:
    """A 2-layer GPT-2 of width 16 over GPT-2's vocabulary, with the tokenizer files beside it.
    always_eos: the final norm outputs a constant along a long <|endoftext|> embedding, so the tied
    head's argmax is EOS whatever the input."""
    D, L, P = 16, 2, 64
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(0.0, 0.02, shape).astype(np.float32)
    t = {"wte.weight": normal(GPT2_VOCAB, D), "wpe.weight": normal(P, D),
         "ln_f.weight": np.ones(D, np.float32), "ln_f.bias": np.zeros(D, np.float32)}
    for i in range(L):
        p = f"h.{i}."
        t |= {p + "ln_1.weight": np.ones(D, np.float32), p + "ln_1.bias": np.zeros(D, np.float32),
              p + "attn.c_attn.weight": normal(D, 3 * D), p + "attn.c_attn.bias": normal(3 * D),
              p + "attn.c_proj.weight": normal(D, D), p + "attn.c_proj.bias": normal(D),
              p + "ln_2.weight": np.ones(D, np.float32), p + "ln_2.bias": np.zeros(D, np.float32),
              p + "mlp.c_fc.weight": normal(D, 4 * D), p + "mlp.c_fc.bias": normal(4 * D),
              p + "mlp.c_proj.weight": normal(4 * D, D), p + "mlp.c_proj.bias": normal(D)}
    if always_eos:
        t["wte.weight"][GPT2_EOS] *= 50
        t["ln_f.weight"][:] = 0
        t["ln_f.bias"][:] = t["wte.weight"][GPT2_EOS]
    dir.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "gpt2", "vocab_size": GPT2_VOCAB, "n_positions": P, "n_embd": D, "n_layer": L, "n_head": 2}
    (dir / "config.json").write_text(json.dumps(config))
    write_safetensors(dir / "model.safetensors", t)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(data_root() / "tokenizer" / "gpt2" / name, dir / name)
    return dir


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> lineage.Model:
    return lineage.Model.load(write_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"), seed=1))


@pytest.fixture(scope="session")
def eos_gpt2(tmp_path_factory) -> lineage.Model:
    return lineage.Model.load(write_tiny_gpt2(tmp_path_factory.mktemp("eos_gpt2"), seed=2, always_eos=True))
