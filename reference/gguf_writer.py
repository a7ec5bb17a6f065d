"""GGUF files written from the format's definition (ggml docs/gguf.md; shared/spec/quantized-formats.md §3.1),
not from lineage's code: the tests' GGUF inputs. Usage:
  /usr/bin/python3 reference/gguf_writer.py OUT_DIR
writes OUT_DIR/kinds_v3.gguf (every metadata type, nested arrays, F32/F16/BF16/Q8_0/Q4_K/MXFP4 tensors of
seeded bytes), OUT_DIR/aligned_v2.gguf (version 2, general.alignment 64), and OUT_DIR/bad/*.gguf, each
damaged one way (see BAD_CASES: name -> what the reader must say)."""

import os
import struct
import sys

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
           I64: "<q", F64: "<d"}
# ggml type id -> (elements per block, bytes per block)
GGML = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
        10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18), 39: (32, 17)}


def gguf_string(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(t: int, v, elem: int = None) -> bytes:
    if t == STRING:
        return gguf_string(v)
    if t == ARRAY:
        et, items = elem
        parts = [struct.pack("<IQ", et, len(items))]
        for it in items:
            parts.append(value(et, it[1], it[2]) if et == ARRAY else value(et, it))
        return b"".join(parts)
    return struct.pack(_SCALAR[t], v)


def write(path: str, kvs: list, tensors: list, version: int = 3, alignment: int = 32, extra=None):
    """kvs: [(key, type, value, elem)] (elem: (element type, items) for arrays); tensors: [(name, ne, ggml type,
    bytes)]. The data section aligned, each tensor padded to the alignment; extra(bytes) may damage the result."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v, elem in kvs:
        out += gguf_string(key) + struct.pack("<I", t) + value(t, v, elem)
    offset, data = 0, b""
    for name, ne, gt, blob in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gt, offset)
        pad = (-len(blob)) % alignment
        data += blob + b"\0" * pad
        offset += len(blob) + pad
    out += b"\0" * ((-len(out)) % alignment)
    out += data
    if extra:
        out = extra(out)
    with open(path, "wb") as f:
        f.write(out)


def tensor_bytes(ne: list, gt: int, rng) -> bytes:
    block, nbytes = GGML[gt]
    n = int(np.prod(ne))
    return rng.integers(0, 256, n // block * nbytes, dtype=np.uint8).tobytes()


def kinds(rng):
    nested = (ARRAY, [(ARRAY, None, (I32, [1, -2, 3])), (ARRAY, None, (I32, [])), (ARRAY, None, (I32, [7]))])
    kvs = [("general.architecture", STRING, "lineage-test", None), ("general.name", STRING, "k\u00e4nds \u2713", None),
           ("t.u8", U8, 250, None), ("t.i8", I8, -7, None), ("t.u16", U16, 65000, None), ("t.i16", I16, -30000, None),
           ("t.u32", U32, 4000000000, None), ("t.i32", I32, -2000000000, None), ("t.f32", F32, 0.25, None),
           ("t.bool", BOOL, True, None), ("t.u64", U64, 2 ** 53 - 1, None), ("t.i64", I64, -(2 ** 40), None),
           ("t.f64", F64, -1.5e300, None), ("t.strings", ARRAY, None, (STRING, ["a", "", "\u00e9t\u00e9"])),
           ("t.floats", ARRAY, None, (F32, [1.0, -0.5])), ("t.nested", ARRAY, None, nested),
           ("t.empty", ARRAY, None, (U8, []))]
    tensors = []
    for name, ne, gt in (("f32", [3, 2], 0), ("f16", [4], 1), ("bf16", [2, 2, 2], 30), ("q8_0", [64, 2], 8),
                         ("q4_k", [256, 1], 12), ("mxfp4", [32, 3, 1, 2], 39)):
        tensors.append((name, ne, gt, tensor_bytes(ne, gt, rng)))
    return kvs, tensors


# name -> (writer of the damaged file, a phrase the error names)
def bad_cases(kvs, tensors):
    base = lambda **kw: (lambda p: write(p, kvs, tensors, **kw))

    def raw(b: bytes):
        return lambda p: open(p, "wb").write(b)

    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    return {
        "magic": (raw(b"GGML" + b"\0" * 28), "GGUF"),
        "version": (base(version=1), "version 1"),
        "truncated": (base(extra=lambda b: b[:len(b) - 40]), "past the end"),
        "header_cut": (raw(header[:20]), "the metadata count"),
        "string_past_end": (raw(header + gguf_string("k") + struct.pack("<IQ", STRING, 10 ** 6) + b"ab"), "\"k\""),
        "array_past_end": (raw(header + gguf_string("k") + struct.pack("<IIQ", ARRAY, U32, 2 ** 40)), "array of"),
        "unknown_value_type": (raw(header + gguf_string("k") + struct.pack("<I", 13) + b"\0" * 8), "value type"),
        "bad_bool": (raw(header + gguf_string("k") + struct.pack("<IB", BOOL, 2)), "bool"),
        "duplicate_key": (lambda p: write(p, kvs + [kvs[0]], tensors), "twice"),
        "bad_alignment": (lambda p: write(p, kvs + [("general.alignment", U32, 48, None)], tensors), "power of two"),
        "unknown_tensor_type": (lambda p: write(p, kvs, [("x", [4], 5, b"\0" * 16)]), "ggml type"),
        "partial_block": (lambda p: write(p, kvs, [("x", [40, 1], 8, b"\0" * 34)]), "whole Q8_0 blocks"),
        "tensor_past_end": (lambda p: write(p, kvs, [("x", [1024, 1024], 0, b"\0" * 64)]), "past the end"),
        "wrapped_dims": (lambda p: write(p, kvs, [("x", [2 ** 62, 8], 0, b"")]), "63 bits"),
        "duplicate_tensor": (lambda p: write(p, kvs, [tensors[0], tensors[0]]), "twice"),
        "too_many_dims": (lambda p: write(p, kvs, [("x", [1, 1, 1, 1, 1], 0, b"\0" * 4)]), "dims"),
    }


def main() -> int:
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    rng = np.random.default_rng(39)
    kvs, tensors = kinds(rng)
    write(os.path.join(out, "kinds_v3.gguf"), kvs, tensors)
    write(os.path.join(out, "aligned_v2.gguf"), kvs + [("general.alignment", U32, 64, None)], tensors, version=2,
          alignment=64)
    with open(os.path.join(out, "bad", "expected.txt"), "w") as f:
        for name, (writer, says) in bad_cases(kvs, tensors).items():
            writer(os.path.join(out, "bad", name + ".gguf"))
            f.write(f"{name}\t{says}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
