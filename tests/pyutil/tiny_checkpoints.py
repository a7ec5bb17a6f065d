"""Small seeded checkpoints in the real formats (config.json + safetensors + GPT-2's tokenizer
files), shared by the Python binding tests and the server tests. GPT-2's vocabulary comes from the
test data the reference_tokenizer fixture writes (LINEAGE_TESTDATA/tokenizer/gpt2)."""
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np


def data_root() -> Path:
    # Missing data is a failure, not a skip: the ctest entries require the fixtures that write it.
    root = os.environ.get("LINEAGE_TESTDATA")
    assert root, "LINEAGE_TESTDATA is not set (run through ctest)"
    path = Path(root)
    assert path.is_dir(), f"LINEAGE_TESTDATA={root} does not exist; run reference/make_goldens.py --out {root}"
    return path


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


def read_safetensors(path: Path) -> dict:
    """The F32 tensors of a safetensors file, by name."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{path}: {name} is {info['dtype']}; expected F32"
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<f4").reshape(info["shape"])
    return out


# A chat template in Kimi's format (<|im_user|> / <|im_assistant|> / <|im_middle|>), each message
# ending with the tokenizer's EOS so that a reply's EOS is the token the next render writes.
KIMI_STYLE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|endoftext|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}")


def write_tiny_hybrid(dir: Path, seed: int = 3) -> Path:
    """The reference's tiny Kimi Linear (3 KDA layers and one MLA layer, MoE; LINEAGE_TESTDATA/
    kimi_linear/f32) widened to GPT-2's vocabulary: its embedding and head rows are kept and the
    rest drawn at random, GPT-2's tokenizer files and a Kimi-style chat template beside it."""
    src = data_root() / "kimi_linear" / "f32"
    config = json.loads((src / "config.json").read_text())
    tensors = dict(read_safetensors(src / "model.safetensors"))
    rng = np.random.default_rng(seed)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        old = tensors[name]
        new = rng.normal(0.0, float(old.std()), (GPT2_VOCAB, old.shape[1])).astype(np.float32)
        new[:old.shape[0]] = old
        tensors[name] = new
    config |= {"vocab_size": GPT2_VOCAB, "bos_token_id": GPT2_EOS, "eos_token_id": GPT2_EOS, "pad_token_id": GPT2_EOS}
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "config.json").write_text(json.dumps(config, indent=1))
    write_safetensors(dir / "model.safetensors", tensors)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(data_root() / "tokenizer" / "gpt2" / name, dir / name)
    (dir / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": KIMI_STYLE_TEMPLATE, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))
    return dir
