# Shared fixtures of the binding tests: the reference's test data (build/testdata, written by the
# reference_goldens and reference_tokenizer fixtures of tests/CMakeLists.txt) and a tiny GPT-2 with
# the real 50257-token vocabulary, written here as config.json + safetensors + tokenizer files.
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import lineage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "pyutil"))
from tiny_checkpoints import GPT2_EOS, GPT2_VOCAB, data_root, write_safetensors, write_tiny_gpt2  # noqa: E402


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


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> lineage.Model:
    return lineage.Model.load(write_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"), seed=1))


@pytest.fixture(scope="session")
def eos_gpt2(tmp_path_factory) -> lineage.Model:
    return lineage.Model.load(write_tiny_gpt2(tmp_path_factory.mktemp("eos_gpt2"), seed=2, always_eos=True))
