"""Minimal safetensors writer and reader (https://github.com/huggingface/safetensors, format section).
File = u64 little-endian header length N, N bytes of JSON header padded with spaces to a multiple of 8,
then the tensor bytes, contiguous, in header order. Also writes HF sharded checkpoints
(model-0000k-of-0000N.safetensors + model.safetensors.index.json). Used by make_goldens.py.
Dtypes torch 1.13 lacks (F8_E4M3, F8_E5M2: one byte per element) travel as RawTensor: the tag and the raw
bytes as a torch.uint8 tensor of the tensor's shape; read_safetensors returns them that way too."""

import json
import os
import struct

import numpy as np
import torch

# safetensors dtype tag <-> torch dtype. BF16 travels through int16 because numpy has no bfloat16.
_TAG_OF_TORCH = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_TORCH_OF_TAG = {tag: dt for dt, tag in _TAG_OF_TORCH.items()}
_NUMPY_OF_TAG = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<i2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}

# One-byte dtypes without a torch 1.13 dtype, stored as RawTensor.
RAW_TAGS = ("F8_E4M3", "F8_E5M2")


class RawTensor:
    """A tensor of a dtype torch lacks: tag (one of RAW_TAGS) and data, its bytes as a torch.uint8 tensor of
    the tensor's shape (element i = byte i). shape and element_size() as a torch.Tensor's."""

    def __init__(self, tag: str, data: torch.Tensor):
        if tag not in RAW_TAGS:
            raise ValueError(f"RawTensor: unsupported tag {tag!r}")
        if data.dtype != torch.uint8:
            raise ValueError(f"RawTensor: data must be torch.uint8, got {data.dtype}")
        self.tag = tag
        self.data = data

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def element_size(self) -> int:
        return 1

    def __repr__(self) -> str:
        return f"RawTensor({self.tag}, shape={list(self.shape)})"


def dtype_tag(t) -> str:
    """The safetensors dtype tag of a torch.Tensor or RawTensor."""
    if isinstance(t, RawTensor):
        return t.tag
    if t.dtype not in _TAG_OF_TORCH:
        raise ValueError(f"safetensors: unsupported torch dtype {t.dtype}")
    return _TAG_OF_TORCH[t.dtype]


def tensor_bytes(t) -> bytes:
    """Raw little-endian C-order bytes of t (torch.Tensor or RawTensor), as safetensors stores them."""
    if isinstance(t, RawTensor):
        return t.data.detach().contiguous().cpu().numpy().tobytes()
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2", copy=False).tobytes()
    if t.dtype not in _TAG_OF_TORCH:
        raise ValueError(f"safetensors: unsupported torch dtype {t.dtype}")
    return t.numpy().astype(_NUMPY_OF_TAG[_TAG_OF_TORCH[t.dtype]], copy=False).tobytes()


def write_safetensors(path: str, tensors: dict, metadata: dict = None) -> int:
    """Writes tensors (name -> torch.Tensor) to path. Returns the data size in bytes.
    Like the Rust library, lays the data out by element size descending, then by name, so that with the
    8-aligned data start every tensor is naturally aligned (readers may cast an mmap in place)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        t = tensors[name]
        if name == "__metadata__":
            raise ValueError("safetensors: '__metadata__' is reserved")
        blob = tensor_bytes(t)
        header[name] = {
            "dtype": dtype_tag(t),
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the reference implementation aligns the data start to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return offset


def shard_file_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def write_sharded(model_dir: str, tensors: dict, n_shards: int, metadata: dict = None) -> list:
    """Splits tensors (in dict order) into n_shards files of roughly equal size, the way HF
    save_pretrained does, and writes model.safetensors.index.json. Returns the shard file names."""
    names = list(tensors)
    sizes = [len(tensor_bytes(tensors[n])) for n in names]
    total = sum(sizes)
    if not 1 <= n_shards <= len(names):
        raise ValueError(f"write_sharded: n_shards {n_shards} for {len(names)} tensors")
    groups = [[] for _ in range(n_shards)]
    cumulative = 0
    for name, size in zip(names, sizes):
        k = min(n_shards - 1, cumulative * n_shards // total)
        # Never leave a later shard empty: the tensors left must cover the shards left.
        remaining_names = len(names) - sum(len(g) for g in groups)
        k = max(k, n_shards - remaining_names)
        groups[k].append(name)
        cumulative += size
    files = []
    weight_map = {}
    for k, group in enumerate(groups):
        file = shard_file_name(k + 1, n_shards)
        write_safetensors(os.path.join(model_dir, file), {n: tensors[n] for n in group}, metadata)
        files.append(file)
        weight_map.update({n: file for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return files


def read_header(path: str) -> dict:
    """The parsed JSON header of a safetensors file (including __metadata__ if present)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8"))


def read_safetensors(path: str) -> dict:
    """Reads every tensor of a safetensors file into name -> torch.Tensor, in header order, and checks
    that the offsets are sorted, contiguous and cover the data section exactly."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    header.pop("__metadata__", None)
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out = {}
    expected_begin = 0
    for name, info in entries:
        begin, end = info["data_offsets"]
        if begin != expected_begin:
            raise ValueError(f"{path}: tensor '{name}' begins at {begin}, expected {expected_begin}")
        tag, shape = info["dtype"], info["shape"]
        count = int(np.prod(shape, dtype=np.int64))
        if tag not in _NUMPY_OF_TAG and tag not in RAW_TAGS:
            raise ValueError(f"{path}: tensor '{name}' has unsupported dtype {tag}")
        array = np.frombuffer(data[begin:end], dtype=_NUMPY_OF_TAG.get(tag, "u1"))
        if array.size != count:
            raise ValueError(f"{path}: tensor '{name}' has {array.size} elements, shape {shape}")
        t = torch.from_numpy(array.copy()).reshape(shape)
        out[name] = RawTensor(tag, t) if tag in RAW_TAGS else t.view(torch.bfloat16) if tag == "BF16" else t
        expected_begin = end
    if expected_begin != len(data):
        raise ValueError(f"{path}: data section is {len(data)} bytes, tensors cover {expected_begin}")
    return {name: out[name] for name in header}


def read_checkpoint(model_dir: str) -> dict:
    """All tensors of an HF model directory: model.safetensors, or the shards named by the index."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for file in sorted(set(weight_map.values())):
        for name, t in read_safetensors(os.path.join(model_dir, file)).items():
            if weight_map.get(name) != file:
                raise ValueError(f"{model_dir}: '{name}' found in {file}, index says {weight_map.get(name)}")
            out[name] = t
    missing = set(weight_map) - set(out)
    if missing:
        raise ValueError(f"{model_dir}: index names tensors absent from the shards: {sorted(missing)}")
    return out
