"""compressed-tensors (and HF-native fp8) quantized checkpoints: an independent reference for lineage's
quantized loaders and `lineage quantize`, written from /work/shared/spec/quantized-formats.md sections 2 and 6
(the on-disk formats of vllm-project/compressed-tensors and llm-compressor's data-free RTN arithmetic).

Library
* Number formats, from their definitions (no float8 dtype in torch 1.13): round_to (round-to-nearest-even
  into BF16 / F16 / F32 / E4M3 / E2M1 grids, subnormals included), E4M3 bytes (finite range +-448, 0x7F /
  0xFF NaN, |x| >= 464 encodes as NaN like torch's cast), E2M1 nibbles (bit 3 sign, magnitudes 0 .5 1 1.5 2
  3 4 6; a negative value that rounds to zero is 0x8, as compressed-tensors' cast + signbit packing gives),
  E8M0 bytes (2^(s - 127), 255 NaN), pack_int32 / unpack_int32 (compressed-tensors' pack_to_int32: u = q +
  2^(bits-1), element i at bit i*bits of the row's little-endian int32 words), pack_nibbles / unpack_nibbles
  (byte k = code[2k] | code[2k+1] << 4).
* Scheme / make_scheme: the presets W4A16, W4A16_ASYM, W8A16 (int, pack-quantized), FP8_BLOCK,
  FP8_DYNAMIC (float8 block [128, 128] / per channel, float-quantized), MXFP4A16, NVFP4A16 (fp4,
  mxfp4- / nvfp4-pack-quantized), HF_FP8 (quant_method "fp8": weight + weight_scale_inv).
* quantize(w, scheme, ...) -> {suffix: tensor}: llm-compressor's data-free RTN, bit for bit as spec 2.2 and
  6.2a describe: every step rounded to the weight's dtype (the scale, max - min, min / scale, q_min - min /
  scale, x / scale, the zero-point addition), round half to even, zero scales replaced by the scale dtype's
  eps after the zero point was computed.
* dequantize(stored, scheme) -> float64 [out, in]: the engine's defined value of every weight, the code
  times its scale computed once in float32 (exact for BF16 / F16 scales; NVFP4: (scale_fp8 / global) in
  float32 first, then times the E2M1 value in float32), widened.
* quantization_config / quantization_config_groups / hf_fp8_config: config.json's quantization_config.
* plan / quantize_checkpoint / decode_checkpoint: which tensors a config quantizes, and whole checkpoints.

CLI (run with /usr/bin/python3)
  compressed_tensors.py compare --input IN --output OUT --scheme S [--group N] [--ignore ENTRY]...
      re-quantizes IN (a float HF directory) and checks OUT (what `lineage quantize` wrote) tensor by tensor,
      byte for byte, and its quantization_config; exit 1 names the first mismatching tensor and element.
  compressed_tensors.py decode --model DIR --out FILE.npz
      every quantized matrix of DIR dequantized (float64), under its module's ".weight" name.

Stored tensors per module X (X.weight [rows = out, cols = in] in the float checkpoint):
  int (pack-quantized)  X.weight_packed I32 [rows, ceil(cols*bits/32)], X.weight_scale (weight dtype)
                        [rows, cols/group] or [rows, 1] (channel), X.weight_shape I64 [2] = (rows, cols),
                        X.weight_zero_point I32 [ceil(rows*bits/32), n_groups] (asymmetric only),
                        X.weight_g_idx I32 [cols] (actorder "group" only)
  FP8 (float-quantized) X.weight F8_E4M3 [rows, cols], X.weight_scale (weight dtype)
                        [ceil(rows/128), ceil(cols/128)] (block) or [rows, 1] (channel)
  MXFP4                 X.weight_packed U8 [rows, cols/2], X.weight_scale U8 (E8M0) [rows, cols/32]
  NVFP4                 X.weight_packed U8 [rows, cols/2], X.weight_scale F8_E4M3 [rows, cols/16],
                        X.weight_global_scale F32 [1]
  HF fp8                X.weight F8_E4M3 [rows, cols], X.weight_scale_inv [ceil(rows/128), ceil(cols/128)]
                        (multiplies; its dtype as the caller chooses, the weight dtype by default)

Choices where the spec leaves room (each documented where it is implemented):
* An all-zero group of an asymmetric int scheme has zero point 0/0 in the reference; here it is 0 (what
  torch's NaN -> int8 cast gives on x86), its scale the eps and its codes 0.
* NVFP4 fused sets (one shared global scale): q/k/v_proj, gate/up_proj, w1/w3, q_a_proj/kv_a_proj_with_mqa
  under the same parent module (llm-compressor's model-based grouping; its data-free path groups fewer).
* quantization_config writes the QArgs field set of compressed-tensors' recent releases (observer
  "minmax", observer_kwargs {}, scale_dtype, zp_dtype), plus version and transform_config as llm-compressor's
  data-free path does; compare checks only the fields that change meaning unless --strict-config."""

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch

from safetensors_io import RawTensor, dtype_tag, read_checkpoint, tensor_bytes

CT_VERSION = "0.18.0"          # compressed-tensors release written into quantization_config["version"]

# ---------------------------------------------------------------------------------------------------
# Binary floating-point grids: (significand bits incl. the implicit one, exponent of the smallest normal,
# largest finite value).

_GRIDS = {
    torch.bfloat16: (8, -126, (2 - 2 ** -7) * 2.0 ** 127),
    torch.float16: (11, -14, 65504.0),
    torch.float32: (24, -126, (2 - 2 ** -23) * 2.0 ** 127),
    "e4m3": (4, -6, 448.0),
    "e2m1": (2, 0, 6.0),
}
_EPS = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23, "e4m3": 0.125}
_TINY = {torch.bfloat16: 2.0 ** -126, torch.float16: 2.0 ** -14, torch.float32: 2.0 ** -126}

E4M3_MAX = 448.0
E4M3_NAN_FROM = 464.0          # torch's float -> float8_e4m3fn cast gives NaN from here up
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
MX_GROUP = 32
NV_GROUP = 16
NV_GLOBAL_NUMERATOR = 448.0 * 6.0   # FP8 max x FP4 max = 2688


def _grid_round(x: torch.Tensor, p: int, emin: int) -> torch.Tensor:
    """x (float64) rounded to nearest, ties to even, onto the grid of a binary format with p significand bits
    and smallest normal 2^emin (subnormals below it share that binade's spacing); no overflow handling."""
    ax = x.abs()
    _, e = torch.frexp(ax)                       # ax = m 2^e, m in [0.5, 1): ax in [2^(e-1), 2^e)
    exponent = torch.clamp(e.to(torch.int64) - 1, min=emin)
    ulp = torch.pow(torch.full_like(ax, 2.0), (exponent - (p - 1)).to(torch.float64))
    return torch.copysign(torch.round(ax / ulp) * ulp, x)   # ax / ulp is exact; torch.round is half-to-even


def round_to(x: torch.Tensor, fmt) -> torch.Tensor:
    """x (any float tensor, taken as float64) rounded to nearest-even into fmt: torch.bfloat16, float16, float32
    (overflow to +-inf), float64 (unchanged), "e4m3" (|x| >= 464 -> NaN, else at most 448) or "e2m1"
    (saturating at 6). Returns float64 holding the rounded values."""
    x = x.to(torch.float64)
    if fmt == torch.float64:
        return x
    p, emin, top = _GRIDS[fmt]
    r = _grid_round(x, p, emin)
    if fmt == "e4m3":
        return torch.where(x.abs() >= E4M3_NAN_FROM, torch.full_like(r, math.nan), r)
    if fmt == "e2m1":
        return torch.clamp(r, -top, top)
    return torch.where(r.abs() > top, torch.copysign(torch.full_like(r, math.inf), r), r)


def eps_of(dtype) -> float:
    """The value compressed-tensors puts in place of a zero scale: torch.finfo(dtype).eps, 0.125 for FP8."""
    return _EPS[dtype]


# ---------------------------------------------------------------------------------------------------
# FP8 E4M3 (float8_e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 NaN.

def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes -> float64 values (0x7F / 0xFF NaN; 0x80 = -0.0)."""
    c = codes.to(torch.int64)
    sign = torch.where(c & 0x80 != 0, -1.0, 1.0).to(torch.float64)
    e, m = (c >> 3) & 0xF, (c & 0x7).to(torch.float64)
    normal = (1.0 + m / 8.0) * torch.pow(torch.full_like(m, 2.0), (e - 7).to(torch.float64))
    value = torch.where(e == 0, m / 8.0 * 2.0 ** -6, normal)
    value = torch.where((c & 0x7F) == 0x7F, torch.full_like(value, math.nan), value)
    return sign * value


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """Values -> uint8 codes, rounding to nearest even (as torch's cast to float8_e4m3fn): subnormals down to
    2^-9, +-448 the largest finite values, |x| >= 464 and NaN -> 0x7F | sign. The sign bit is x's (-0.0 ->
    0x80)."""
    x = x.to(torch.float64)
    r = round_to(x, "e4m3").abs()
    sign = torch.signbit(x).to(torch.int64) << 7
    _, e = torch.frexp(r)
    exponent = e.to(torch.int64) - 1
    normal = exponent >= -6
    safe_exp = torch.where(normal, exponent, torch.full_like(exponent, -6)).to(torch.float64)
    mant_normal = torch.round(r / torch.pow(torch.full_like(r, 2.0), safe_exp) * 8.0 - 8.0).to(torch.int64)
    code = torch.where(normal, ((exponent + 7) << 3) | mant_normal, torch.round(r / 2.0 ** -9).to(torch.int64))
    code = torch.where(r == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isnan(r), torch.full_like(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


# ---------------------------------------------------------------------------------------------------
# FP4 E2M1 nibbles and E8M0 bytes.

def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (any integer tensor, values 0..15) -> float64: bit 3 sign, bits 0-2 index E2M1_MAGNITUDES."""
    c = codes.to(torch.int64)
    magnitude = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)[c & 7]
    return torch.where(c & 8 != 0, -magnitude, magnitude)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Values -> 4-bit codes (uint8), rounding to nearest even and saturating at +-6 (compressed-tensors'
    cast_to_fp4: ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). The sign bit is
    set for every x < 0, so a negative value that rounds to zero is 0x8; +-0.0 itself is 0x0 (torch.sign(-0.0)
    is 0 in the reference)."""
    x = x.to(torch.float64)
    r = round_to(x.abs(), "e2m1")
    index = torch.searchsorted(torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64), r.contiguous())
    return (index | ((x < 0).to(torch.int64) << 3)).to(torch.uint8)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float64 2^(s - 127); 255 is NaN."""
    s = codes.to(torch.int64)
    value = torch.pow(torch.full(s.shape, 2.0, dtype=torch.float64), (s - 127).to(torch.float64))
    return torch.where(s == 255, torch.full_like(value, math.nan), value)


def e8m0_encode(x: torch.Tensor) -> torch.Tensor:
    """Powers of two 2^-127..2^127 -> E8M0 bytes. Raises on anything else."""
    x = x.to(torch.float64)
    m, e = torch.frexp(x)
    s = e.to(torch.int64) - 1 + 127
    if not bool(((m == 0.5) & (s >= 0) & (s <= 254)).all()):
        raise ValueError("e8m0_encode: every value must be a power of two in 2^-127..2^127")
    return s.to(torch.uint8)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [rows, cols] (cols even) -> uint8 [rows, cols/2], byte k = code[2k] | code[2k+1] << 4."""
    c = codes.to(torch.int64)
    if c.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: odd column count {c.shape[-1]}")
    return ((c[..., 0::2] & 15) | ((c[..., 1::2] & 15) << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, n] -> codes int64 [rows, 2n] (low nibble first)."""
    p = packed.to(torch.int64)
    return torch.stack((p & 15, p >> 4), dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


# ---------------------------------------------------------------------------------------------------
# int32 packing (compressed-tensors pack_to_int32 / unpack_from_int32, dense 1..8-bit).

def pack_int32(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed codes q [rows, cols] in [-2^(bits-1), 2^(bits-1)) -> int32 [rows, ceil(cols bits / 32)]: u = q +
    2^(bits-1), element i of a row at bits i*bits .. i*bits + bits - 1 of the row read as one little-endian
    bit string of 32-bit words (an element may straddle two words); unused high bits are zero."""
    if not 1 <= bits <= 8:
        raise ValueError(f"pack_int32: bits {bits} outside 1..8")
    q = q.to(torch.int64)
    half = 1 << (bits - 1)
    if q.numel() and (int(q.min()) < -half or int(q.max()) >= half):
        raise ValueError(f"pack_int32: codes outside [{-half}, {half})")
    rows, cols = q.shape
    u = (q + half).numpy().astype(np.uint64)
    bit_planes = (u[:, :, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)   # [rows, cols, bits], LSB first
    stream = bit_planes.reshape(rows, cols * bits)
    words = -(-cols * bits // 32)
    stream = np.concatenate([stream, np.zeros((rows, words * 32 - cols * bits), dtype=np.uint64)], axis=1)
    packed = (stream.reshape(rows, words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=2)
    return torch.from_numpy(packed.astype(np.uint32).view(np.int32).copy())


def unpack_int32(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """The inverse of pack_int32: int32 [rows, words] -> signed codes int64 [rows, cols]."""
    if packed.dtype != torch.int32:
        raise ValueError(f"unpack_int32: expected int32 words, got {packed.dtype}")
    rows, words = packed.shape
    if words != -(-cols * bits // 32):
        raise ValueError(f"unpack_int32: {words} words per row cannot hold {cols} {bits}-bit codes exactly")
    w = packed.numpy().view(np.uint32).astype(np.uint64)
    stream = ((w[:, :, None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1)).reshape(rows, words * 32)
    planes = stream[:, :cols * bits].reshape(rows, cols, bits)
    u = (planes << np.arange(bits, dtype=np.uint64)).sum(axis=2).astype(np.int64)
    return torch.from_numpy(u) - (1 << (bits - 1))


# ---------------------------------------------------------------------------------------------------
# Schemes

INT_FORMAT, FLOAT_FORMAT = "pack-quantized", "float-quantized"
MXFP4_FORMAT, NVFP4_FORMAT, MIXED_FORMAT = "mxfp4-pack-quantized", "nvfp4-pack-quantized", "mixed-precision"


@dataclass(frozen=True)
class Scheme:
    """One weight quantization: a compressed-tensors QArgs (plus hf for the HF-native fp8 layout)."""
    preset: str                    # W4A16, W4A16_ASYM, W8A16, FP8_BLOCK, FP8_DYNAMIC, MXFP4A16, NVFP4A16, HF_FP8
    num_bits: int
    type: str                      # "int" | "float"
    symmetric: bool
    strategy: str                  # group | channel | block | tensor_group | tensor
    group_size: Optional[int] = None
    block_structure: Optional[tuple] = None
    actorder: Optional[str] = None  # "group": columns grouped by weight_g_idx
    hf: bool = False

    @property
    def kind(self) -> str:
        """int | fp8 | mxfp4 | nvfp4."""
        if self.type == "int":
            return "int"
        if self.num_bits == 8:
            return "fp8"
        return "nvfp4" if self.group_size == NV_GROUP else "mxfp4"

    @property
    def format(self) -> str:
        """The compressed-tensors format (compressors/format.py priority for weight-only / FP8 presets)."""
        return {"int": INT_FORMAT, "fp8": FLOAT_FORMAT, "mxfp4": MXFP4_FORMAT, "nvfp4": NVFP4_FORMAT}[self.kind]


PRESETS = {
    "W4A16": Scheme("W4A16", 4, "int", True, "group", 128),
    "W4A16_ASYM": Scheme("W4A16_ASYM", 4, "int", False, "group", 128),
    "W8A16": Scheme("W8A16", 8, "int", True, "group", 128),
    "FP8_BLOCK": Scheme("FP8_BLOCK", 8, "float", True, "block", block_structure=(128, 128)),
    "FP8_DYNAMIC": Scheme("FP8_DYNAMIC", 8, "float", True, "channel"),
    "MXFP4A16": Scheme("MXFP4A16", 4, "float", True, "group", MX_GROUP),
    "NVFP4A16": Scheme("NVFP4A16", 4, "float", True, "tensor_group", NV_GROUP),
    "HF_FP8": Scheme("HF_FP8", 8, "float", True, "block", block_structure=(128, 128), hf=True),
}
ALIASES = {"MXFP4": "MXFP4A16", "NVFP4": "NVFP4A16", "FP8_CHANNEL": "FP8_DYNAMIC"}


def make_scheme(name, group=None, actorder: Optional[str] = None) -> Scheme:
    """A preset by name (or alias), or a Scheme as is. group (int schemes only): a group size > 0, or
    "channel" / -1 / 0 for one scale per row. actorder "group" (int group schemes): columns grouped by g_idx."""
    if isinstance(name, Scheme):
        scheme = name
    else:
        key = ALIASES.get(str(name).upper(), str(name).upper())
        if key not in PRESETS:
            raise ValueError(f"unknown scheme {name!r}; known: {sorted(PRESETS) + sorted(ALIASES)}")
        scheme = PRESETS[key]
    if group is not None:
        if scheme.kind != "int":
            raise ValueError(f"{scheme.preset}: the group size is fixed")
        if str(group).lower() in ("channel", "-1", "0"):
            scheme = replace(scheme, strategy="channel", group_size=None)
        else:
            size = int(group)
            if size <= 0:
                raise ValueError(f"group size {group!r}")
            scheme = replace(scheme, strategy="group", group_size=size)
    if actorder is not None:
        if scheme.strategy != "group" or actorder != "group":
            raise ValueError("actorder 'group' needs an int group scheme")
        scheme = replace(scheme, actorder="group")
    return scheme


def scheme_from_qargs(weights: dict, quant_method: str = "compressed-tensors") -> Scheme:
    """A Scheme from a config group's "weights" QArgs. Raises ValueError on what this reference cannot decode."""
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    strategy, group = weights.get("strategy"), weights.get("group_size")
    symmetric = bool(weights.get("symmetric", True))
    block = weights.get("block_structure")
    if strategy is None:
        strategy = "tensor" if group is None else "group" if group > 0 else "channel"
    if strategy == "group" and (group is None or group <= 0):
        raise ValueError(f"QArgs: group strategy with group_size {group!r}")
    actorder = weights.get("actorder")
    actorder = {True: "group", "dynamic": "group", "static": "weight", False: None}.get(actorder, actorder)
    if kind == "int" and 1 <= bits <= 8 and strategy in ("group", "channel"):
        return Scheme("custom", bits, "int", symmetric, strategy, group if strategy == "group" else None,
                      actorder=actorder if actorder == "group" else None)
    if kind == "float" and bits == 8 and symmetric and strategy in ("block", "channel", "tensor"):
        return Scheme("custom", 8, "float", True, strategy, block_structure=tuple(block) if block else None)
    if kind == "float" and bits == 4 and symmetric and group in (MX_GROUP, NV_GROUP):
        return Scheme("custom", 4, "float", True, strategy, group)
    raise ValueError(f"QArgs not supported by this reference: {weights}")


# ---------------------------------------------------------------------------------------------------
# Quantization (llm-compressor data-free RTN, spec 2.2 and 6.2a)

def _promote(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return torch.promote_types(a, b)


def _column_groups(cols: int, scheme: Scheme, g_idx: Optional[torch.Tensor]) -> tuple:
    """(group of each column int64 [cols], number of groups) for an int / fp4 group or channel scheme."""
    if scheme.strategy == "channel":
        return torch.zeros(cols, dtype=torch.int64), 1
    size = scheme.group_size
    if cols % size:
        raise ValueError(f"{cols} columns are not a multiple of the group size {size}")
    n = cols // size
    if g_idx is None:
        return torch.arange(cols) // size, n
    g = g_idx.to(torch.int64)
    if list(g.shape) != [cols] or bool((torch.bincount(g, minlength=n) != size).any()) or int(g.max()) >= n:
        raise ValueError(f"g_idx must give each of the {n} groups exactly {size} columns")
    return g, n


def _group_min_max(x: torch.Tensor, group: torch.Tensor, n_groups: int) -> tuple:
    """Per (row, group) min and max of x [rows, cols] (float64), each widened to include 0."""
    order = torch.argsort(group, stable=True)
    xs = x[:, order].reshape(x.shape[0], n_groups, -1)
    zero = torch.zeros(1, dtype=torch.float64)
    return torch.minimum(xs.amin(dim=2), zero), torch.maximum(xs.amax(dim=2), zero)


def _block_absmax(x: torch.Tensor, block: tuple) -> torch.Tensor:
    """max |x| per [bh, bw] block (the last row / column of blocks may be partial) -> [ceil(r/bh), ceil(c/bw)]."""
    rows, cols = x.shape
    bh, bw = block
    nr, nc = -(-rows // bh), -(-cols // bw)
    padded = torch.zeros(nr * bh, nc * bw, dtype=torch.float64)
    padded[:rows, :cols] = x.abs()
    return padded.reshape(nr, bh, nc, bw).amax(dim=(1, 3))


def _expand_blocks(s: torch.Tensor, shape: tuple, block: tuple) -> torch.Tensor:
    rows, cols = shape
    return s.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)[:rows, :cols]


def pow2round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """compressed-tensors' round_to_power_2 (spec 6.2a) on values x >= 0 of dtype, defined on the value: a
    normal x = s 2^E (s in [1, 2)) gives 2^E, or 2^(E+1) when s >= 1.75 (overflowing to inf past the
    format); a subnormal x gives the smallest normal 2^emin when x >= 0.75 2^emin, else 0; 0 stays 0."""
    _, emin, top = _GRIDS[dtype]
    x = x.to(torch.float64)
    _, e = torch.frexp(x)
    exponent = (e.to(torch.int64) - 1).to(torch.float64)
    power = torch.pow(torch.full_like(x, 2.0), exponent)
    normal = torch.where(x / power >= 1.75, 2.0 * power, power)
    normal = torch.where(normal > top, torch.full_like(normal, math.inf), normal)
    subnormal = torch.where(x >= 0.75 * 2.0 ** emin, torch.full_like(x, 2.0 ** emin), torch.zeros_like(x))
    return torch.where(x >= 2.0 ** emin, normal, subnormal)


def quantize(w: torch.Tensor, scheme, group_size=None, fused_global_amax: Optional[float] = None,
             g_idx: Optional[torch.Tensor] = None, scale_dtype: Optional[torch.dtype] = None,
             arith_dtype: Optional[torch.dtype] = None) -> dict:
    """Quantizes one Linear weight w [out, in] (BF16, F16 or F32) as llm-compressor's data-free RTN does.
    Returns {suffix: tensor} (see the module doc): int -> weight_packed, weight_scale, weight_shape
    (+ weight_zero_point, weight_g_idx); FP8 -> weight (RawTensor F8_E4M3), weight_scale (or weight_scale_inv
    for HF_FP8); MXFP4 -> weight_packed, weight_scale (U8); NVFP4 -> weight_packed, weight_scale (F8_E4M3),
    weight_global_scale. group_size overrides an int preset's group (or "channel"); fused_global_amax (NVFP4)
    is max |w| over the fused set sharing the global scale (default: this tensor's); g_idx (int, actorder
    "group") the group of each column. scale_dtype (HF_FP8 only) the stored scale dtype, default the weight's.
    arith_dtype (tests only) rounds every step to that dtype instead of the weight's."""
    scheme = make_scheme(scheme, group_size)
    if w.dim() != 2 or w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"quantize: expected a 2-D BF16/F16/F32 weight, got {w.dtype} {list(w.shape)}")
    if scheme.actorder == "group" and g_idx is None:
        raise ValueError("quantize: actorder 'group' needs g_idx")
    if g_idx is not None and scheme.actorder != "group":
        raise ValueError("quantize: g_idx given for a scheme without actorder 'group'")
    if scale_dtype is not None and not scheme.hf:
        raise ValueError("quantize: scale_dtype is the weight dtype for compressed-tensors schemes")
    wd = w.dtype
    sd = scale_dtype or wd                    # the scale parameter's dtype (initialize.py: the weight's)
    qd = arith_dtype or sd                    # where the qparam steps round (min/max are in the weight dtype)
    xd = arith_dtype or _promote(wd, sd)      # where x / scale (+ zp) rounds (torch type promotion)
    x = w.to(torch.float64)
    rows, cols = x.shape
    kind = scheme.kind
    if kind == "int":
        return _quantize_int(x, scheme, g_idx, wd, qd, xd)
    if kind == "fp8":
        return _quantize_fp8(x, scheme, sd, qd, xd)
    if wd == torch.float16:
        raise ValueError("quantize: FP4 schemes take BF16 or F32 weights")
    if cols % scheme.group_size:
        raise ValueError(f"quantize: {cols} columns are not a multiple of {scheme.group_size}")
    if kind == "mxfp4":
        return _quantize_mxfp4(x, wd, qd, xd)
    return _quantize_nvfp4(x, fused_global_amax, wd, qd, arith_dtype)


def _quantize_int(x, scheme, g_idx, wd, qd, xd) -> dict:
    rows, cols = x.shape
    bits = scheme.num_bits
    q_min, q_max = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    group, n_groups = _column_groups(cols, scheme, g_idx)
    mn, mx = _group_min_max(x, group, n_groups)
    if scheme.symmetric:
        scale = round_to(torch.maximum(-mn, mx) / ((q_max - q_min) / 2), qd)      # amax / 7.5 (int4)
        zp = torch.zeros_like(scale)
    else:
        scale = round_to(round_to(mx - mn, qd) / (q_max - q_min), qd)             # (max - min) / 15
        zp = round_to(q_min - round_to(mn / scale, qd), qd)                         # 0/0 = NaN for a zero group
        zp = torch.clamp(zp, q_min, q_max)
    scale = torch.where(scale == 0, torch.full_like(scale, eps_of(qd)), scale)     # after the zero point
    # The zero point as stored (int8): round half to even; NaN (an all-zero group) defined as 0.
    zp = torch.where(torch.isnan(zp), torch.zeros_like(zp), torch.round(torch.clamp(zp, -128, 127)))
    t = round_to(x / scale[:, group], xd)
    if not scheme.symmetric:
        t = round_to(t + zp[:, group], xd)
    q = torch.clamp(torch.round(t), q_min, q_max).to(torch.int64)
    out = {"weight_packed": pack_int32(q, bits), "weight_scale": scale.to(wd),
           "weight_shape": torch.tensor([rows, cols], dtype=torch.int64)}
    if not scheme.symmetric:
        out["weight_zero_point"] = pack_int32(zp.to(torch.int64).T, bits).T.contiguous()
    if scheme.actorder == "group":
        out["weight_g_idx"] = group.to(torch.int32)
    return out


def _quantize_fp8(x, scheme, sd, qd, xd) -> dict:
    rows, cols = x.shape
    if scheme.strategy == "block":
        amax = _block_absmax(x, scheme.block_structure)
        expand = lambda s: _expand_blocks(s, (rows, cols), scheme.block_structure)  # noqa: E731
    elif scheme.strategy == "channel":
        amax = x.abs().amax(dim=1, keepdim=True)
        expand = lambda s: s.expand(rows, cols)  # noqa: E731
    else:
        raise ValueError(f"quantize: FP8 strategy {scheme.strategy} not supported")
    scale = round_to(amax / E4M3_MAX, qd)                    # amax / ((448 - (-448)) / 2)
    scale = torch.where(scale == 0, torch.full_like(scale, eps_of(qd)), scale)
    t = torch.clamp(round_to(x / expand(scale), xd), -E4M3_MAX, E4M3_MAX)
    codes = RawTensor("F8_E4M3", e4m3_encode(t))
    return {"weight": codes, ("weight_scale_inv" if scheme.hf else "weight_scale"): scale.to(sd)}


def _quantize_mxfp4(x, wd, qd, xd) -> dict:
    rows, cols = x.shape
    group = torch.arange(cols) // MX_GROUP
    mn, mx = _group_min_max(x, group, cols // MX_GROUP)
    amax = torch.maximum(-mn, mx)
    exponent = torch.floor(torch.log2(pow2round(amax, qd)))   # -inf for 0
    s = torch.clamp(127.0 + exponent - 2.0, 0, 255)           # 2 = floor(log2(6)); clamp as the uint8 cast
    scale = round_to(torch.pow(torch.full_like(s, 2.0), s - 127.0), qd)
    t = torch.clamp(round_to(x / scale[:, group], xd), -FP4_MAX, FP4_MAX)
    return {"weight_packed": pack_nibbles(e2m1_encode(t)), "weight_scale": s.to(torch.uint8)}


def nvfp4_global_scale(amax: float, dtype: torch.dtype, arith_dtype: Optional[torch.dtype] = None) -> float:
    """compressed-tensors' generate_gparam on amax (a value of dtype): 2688 * reciprocal(max(amax, tiny)), both
    steps rounded to dtype; a non-finite result is 1.0. Returned as the float32 value stored."""
    d = arith_dtype or dtype
    a = torch.tensor([max(float(amax), _TINY[dtype])], dtype=torch.float64)
    g = round_to(NV_GLOBAL_NUMERATOR * round_to(1.0 / a, d), d)
    g = float(round_to(g, torch.float32)[0])
    return g if math.isfinite(g) else 1.0


def _quantize_nvfp4(x, fused_global_amax, wd, qd, arith_dtype) -> dict:
    rows, cols = x.shape
    amax_tensor = float(x.abs().max()) if x.numel() else 0.0
    if fused_global_amax is not None and fused_global_amax < amax_tensor:
        raise ValueError("quantize: fused_global_amax is below this tensor's own max |w|")
    g = nvfp4_global_scale(amax_tensor if fused_global_amax is None else fused_global_amax, wd, arith_dtype)
    group = torch.arange(cols) // NV_GROUP
    mn, mx = _group_min_max(x, group, cols // NV_GROUP)
    s0 = round_to(torch.maximum(-mn, mx) / FP4_MAX, qd)                      # bf16(amax / 6)
    s1 = round_to(g * s0, arith_dtype or torch.float32)                      # global * scale, float32
    s2 = round_to(torch.clamp(s1, -E4M3_MAX, E4M3_MAX), "e4m3")
    s2 = torch.where(s2 == 0, torch.full_like(s2, eps_of("e4m3")), s2)
    f32 = arith_dtype or torch.float32
    effective = round_to(s2 / g, f32)                                          # scale / global_scale, float32
    t = torch.clamp(round_to(x / effective[:, group], f32), -FP4_MAX, FP4_MAX)
    return {"weight_packed": pack_nibbles(e2m1_encode(t)), "weight_scale": RawTensor("F8_E4M3", e4m3_encode(s2)),
            "weight_global_scale": torch.tensor([g], dtype=torch.float32)}


# ---------------------------------------------------------------------------------------------------
# Dequantization: the engine's defined value (code times scale once in float32), widened to float64.

def _float_values(t) -> torch.Tensor:
    """A stored float tensor (torch float dtype or RawTensor F8_E4M3) as float64 values."""
    if isinstance(t, RawTensor):
        if t.tag != "F8_E4M3":
            raise ValueError(f"unsupported stored dtype {t.tag}")
        return e4m3_decode(t.data)
    if not t.is_floating_point():
        raise ValueError(f"expected a float tensor, got {t.dtype}")
    return t.to(torch.float64)


def dequantize(stored: dict, scheme) -> torch.Tensor:
    """One module's stored tensors {suffix: tensor} -> its weight, float64 [out, in]; scheme a Scheme, preset
    name or a config group's "weights" QArgs dict. w = (q - zp) scale per group
    / channel / block (int, FP8, HF fp8: the product computed once in float32, exact for BF16 / F16 scales),
    e2m1 2^(s - 127) (MXFP4), e2m1 (scale_fp8 / global_scale) with the division in float32 first (NVFP4)."""
    scheme = scheme_from_qargs(scheme) if isinstance(scheme, dict) else make_scheme(scheme)
    f32 = torch.float32
    kind = scheme.kind
    if kind == "int":
        rows, cols = [int(v) for v in stored["weight_shape"].tolist()]
        q = unpack_int32(stored["weight_packed"], scheme.num_bits, cols).to(torch.float64)
        if list(q.shape) != [rows, cols]:
            raise ValueError(f"weight_packed holds {list(q.shape)} codes, weight_shape says {[rows, cols]}")
        scale = _float_values(stored["weight_scale"])
        g_idx = stored.get("weight_g_idx")
        if g_idx is not None:
            group = g_idx.to(torch.int64)
        elif scheme.strategy == "channel":
            group = torch.zeros(cols, dtype=torch.int64)
        else:
            group = torch.arange(cols) // scheme.group_size
        n_groups = 1 if scheme.strategy == "channel" else cols // scheme.group_size
        if list(scale.shape) != [rows, n_groups]:
            raise ValueError(f"weight_scale {list(scale.shape)}, expected {[rows, n_groups]}")
        if "weight_zero_point" in stored:
            zp = unpack_int32(stored["weight_zero_point"].T.contiguous(), scheme.num_bits, rows).T.to(torch.float64)
            q = q - zp[:, group]
        return round_to(q * scale[:, group], f32)
    if kind == "fp8":
        q = _float_values(stored["weight"])
        rows, cols = q.shape
        scale = _float_values(stored["weight_scale_inv" if scheme.hf else "weight_scale"])
        if scheme.strategy == "block":
            bh, bw = scheme.block_structure
            if list(scale.shape) != [-(-rows // bh), -(-cols // bw)]:
                raise ValueError(f"block scale {list(scale.shape)} for a [{rows}, {cols}] weight, block {[bh, bw]}")
            scale = _expand_blocks(scale, (rows, cols), (bh, bw))
        elif scheme.strategy == "channel":
            scale = scale.reshape(rows, 1)
        else:
            scale = scale.reshape(1, 1)
        return round_to(q * scale, f32)
    codes = unpack_nibbles(stored["weight_packed"])
    values = e2m1_decode(codes)
    group = torch.arange(codes.shape[1]) // scheme.group_size
    if kind == "mxfp4":
        return round_to(values * e8m0_decode(stored["weight_scale"])[:, group], f32)
    g = stored["weight_global_scale"].to(torch.float64).reshape(())
    effective = round_to(_float_values(stored["weight_scale"]) / g, f32)
    return round_to(values * effective[:, group], f32)


# ---------------------------------------------------------------------------------------------------
# quantization_config

DEFAULT_IGNORE = ["lm_head", "re:.*embed_tokens$", "re:.*embeddings$", "re:.*norm$", r"re:.*mlp\.gate$",
                  r"re:.*shared_expert_gate$", r"re:.*block_sparse_moe\.gate$", "re:.*conv1d$", "re:.*A_log$",
                  "re:.*dt_bias$"]


def weight_qargs(scheme) -> dict:
    """The "weights" QArgs of a config group, every field compressed-tensors serializes."""
    s = make_scheme(scheme)
    scale_dtype = {"mxfp4": "torch.uint8", "nvfp4": "torch.float8_e4m3fn"}.get(s.kind)
    return {"actorder": s.actorder, "block_structure": list(s.block_structure) if s.block_structure else None,
            "dynamic": False, "group_size": s.group_size, "num_bits": s.num_bits, "observer": "minmax",
            "observer_kwargs": {}, "scale_dtype": scale_dtype, "strategy": s.strategy, "symmetric": s.symmetric,
            "type": s.type, "zp_dtype": None if s.symmetric else "torch.int8"}


def input_qargs(scheme) -> Optional[dict]:
    """The preset's input_activations (FP8_BLOCK: dynamic float8 per group of 128; FP8_DYNAMIC: per token), or
    None (weight-only presets)."""
    s = make_scheme(scheme)
    if s.kind != "fp8":
        return None
    group = s.strategy == "block"
    return {"actorder": None, "block_structure": None, "dynamic": True, "group_size": 128 if group else None,
            "num_bits": 8, "observer": None, "observer_kwargs": {}, "scale_dtype": None,
            "strategy": "group" if group else "token", "symmetric": True, "type": "float", "zp_dtype": None}


def config_group(scheme, targets) -> dict:
    s = make_scheme(scheme)
    return {"format": s.format, "input_activations": input_qargs(s), "output_activations": None,
            "targets": list(targets), "weights": weight_qargs(s)}


def quantization_config_groups(groups: list, ignore: list) -> dict:
    """quantization_config for [(scheme, targets), ...] as config_groups group_0, group_1, ... (format: the
    groups' common format, or mixed-precision)."""
    formats = {make_scheme(s).format for s, _ in groups}
    if any(make_scheme(s).hf for s, _ in groups):
        raise ValueError("HF_FP8 is not a compressed-tensors scheme (hf_fp8_config)")
    return {"config_groups": {f"group_{i}": config_group(s, t) for i, (s, t) in enumerate(groups)},
            "format": formats.pop() if len(formats) == 1 else MIXED_FORMAT, "global_compression_ratio": None,
            "ignore": list(ignore), "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "transform_config": {}, "version": CT_VERSION}


def quantization_config(scheme, group=None, ignore=None, targets=("Linear",)) -> dict:
    """config.json's quantization_config for one scheme (group_0), as compressed-tensors writes it; HF_FP8:
    hf_fp8_config with ignore as modules_to_not_convert."""
    s = make_scheme(scheme, group)
    ignore = list(DEFAULT_IGNORE if ignore is None else ignore)
    if s.hf:
        return hf_fp8_config(ignore, s.block_structure)
    return quantization_config_groups([(s, targets)], ignore)


def hf_fp8_config(modules_to_not_convert: list, block=(128, 128)) -> dict:
    """The HF-native fp8 quantization_config (Qwen / DeepSeek FP8 releases)."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "modules_to_not_convert": list(modules_to_not_convert),
            "quant_method": "fp8", "weight_block_size": list(block)}


# Fields that change what a checkpoint means; compare checks only these unless --strict-config.
_SEMANTIC_TOP = ("quant_method", "format", "quantization_status", "ignore", "kv_cache_scheme", "config_groups",
                 "activation_scheme", "fmt", "modules_to_not_convert", "weight_block_size")
_PARTS = ("weights", "input_activations", "output_activations")
_SEMANTIC_QARGS = ("num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
                   "actorder")


def _flatten(d: dict, prefix: str = "") -> dict:
    """{"a.b.c": leaf} of nested dicts (an empty dict is a leaf)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _is_semantic(path: str, expected: dict, actual: dict) -> bool:
    parts = path.split(".")
    if parts[0] != "config_groups" or len(parts) == 1:
        return parts[0] in _SEMANTIC_TOP
    if len(parts) == 2:
        return True                                   # a group present on one side only
    if parts[2] == "targets" or parts[2] in _PARTS and len(parts) == 3:
        return True                                   # targets; activations null on one side only
    if parts[2] == "format":                          # per-group format: semantic where both write one
        return all("format" in (c.get("config_groups") or {}).get(parts[1], {}) for c in (expected, actual))
    return parts[2] in _PARTS and parts[3] in _SEMANTIC_QARGS


def config_differences(expected: dict, actual: dict) -> tuple:
    """(semantic, other) differences between two quantization_configs, as messages "path: actual, expected
    ..."; semantic ones change what the checkpoint means (method, formats, groups' targets and QArgs numbers,
    ignore), the others are metadata (observer, observer_kwargs, scale_dtype, zp_dtype, version, ...)."""
    fe, fa = _flatten(expected), _flatten(actual)
    semantic, other = [], []
    for path in sorted(set(fe) | set(fa)):
        e, a = fe.get(path, "<absent>"), fa.get(path, "<absent>")
        if e != a:
            (semantic if _is_semantic(path, expected, actual) else other).append(f"{path}: {a!r}, expected {e!r}")
    return semantic, other


# ---------------------------------------------------------------------------------------------------
# Which tensors a config quantizes, and whole checkpoints

def matches(module: str, entry: str) -> bool:
    """compressed-tensors' match_name: "re:<regex>" matched with re.match from the start of the module
    name, anything else the exact module name."""
    return re.match(entry[3:], module) is not None if entry.startswith("re:") else entry == module


def is_ignored(module: str, ignore) -> bool:
    return any(matches(module, entry) for entry in ignore)


def plan(tensors: dict, groups: list, ignore, linear_modules=None) -> dict:
    """{module: Scheme} for the tensors [(scheme, targets)] quantizes: each 2-D "<module>.weight" not ignored,
    the first group whose targets match it. A "Linear" target matches every such module, or with
    linear_modules given (the architecture's Linear modules) only those."""
    out = {}
    for name, t in tensors.items():
        if not name.endswith(".weight") or t.ndim != 2:
            continue
        module = name[:-len(".weight")]
        if is_ignored(module, ignore):
            continue
        for scheme, targets in groups:
            if any((linear_modules is None or module in linear_modules) if target == "Linear"
                   else matches(module, target) for target in targets):
                out[module] = make_scheme(scheme)
                break
    return out


_FUSED_LEAVES = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}, {"w1", "w3"},
                 {"q_a_proj", "kv_a_proj_with_mqa"})


def fused_sets(modules) -> dict:
    """{module: key} for NVFP4's shared global scales: q/k/v_proj, gate/up_proj, w1/w3 and
    q_a_proj/kv_a_proj_with_mqa of the same parent module share a key; others get their own name."""
    out = {}
    for m in modules:
        parent, _, leaf = m.rpartition(".")
        kinds = [i for i, leaves in enumerate(_FUSED_LEAVES) if leaf in leaves]
        out[m] = f"{parent}#{kinds[0]}" if kinds else m
    return out


def quantize_checkpoint(tensors: dict, module_schemes: dict, g_idx: Optional[dict] = None,
                        scale_dtype: Optional[torch.dtype] = None) -> dict:
    """The quantized checkpoint: every module of module_schemes ({module: Scheme}) has "<module>.weight"
    replaced by its quantize() tensors, named "<module>.<suffix>"; every other tensor is kept as is, in
    order. NVFP4 modules share global scales over fused_sets. g_idx: {module: g_idx} for actorder schemes."""
    nv = [m for m, s in module_schemes.items() if s.kind == "nvfp4"]
    keys = fused_sets(nv)
    amax = {}
    for m in nv:
        a = float(tensors[m + ".weight"].to(torch.float64).abs().max())
        amax[keys[m]] = max(amax.get(keys[m], 0.0), a)
    out = {}
    for name, t in tensors.items():
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if module not in module_schemes:
            out[name] = t
            continue
        scheme = module_schemes[module]
        parts = quantize(t, scheme, fused_global_amax=amax.get(keys.get(module)),
                         g_idx=(g_idx or {}).get(module), scale_dtype=scale_dtype if scheme.hf else None)
        out.update({f"{module}.{suffix}": v for suffix, v in parts.items()})
    return out


_CT_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx",
                "weight_global_scale")


def quantized_modules(config: dict, tensors: dict) -> dict:
    """{module: Scheme} of a quantized checkpoint, from its quantization_config and tensor names: HF fp8
    modules have weight_scale_inv; compressed-tensors modules weight_packed, or weight + weight_scale
    (float-quantized), their scheme the first config group whose targets match (a "Linear" target matches any
    module)."""
    qc = config.get("quantization_config")
    if qc is None:
        return {}
    if qc.get("quant_method") == "fp8":
        block = tuple(qc.get("weight_block_size") or (128, 128))
        scheme = replace(PRESETS["HF_FP8"], block_structure=block)
        return {n[:-len(".weight_scale_inv")]: scheme for n in tensors if n.endswith(".weight_scale_inv")}
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"quant_method {qc.get('quant_method')!r} not supported")
    modules = sorted({n.rsplit(".", 1)[0] for n in tensors
                      if n.endswith(".weight_packed") or (n.endswith(".weight_scale")
                                                          and n[:-len("_scale")] in tensors)})
    out = {}
    for m in modules:
        for group in qc["config_groups"].values():
            if any(t == "Linear" or matches(m, t) for t in group["targets"]):
                out[m] = scheme_from_qargs(group["weights"])
                break
        else:
            raise ValueError(f"'{m}' is quantized but no config group targets it")
    return out


def decode_checkpoint(config: dict, tensors: dict) -> dict:
    """{"<module>.weight": float64 weight} for every quantized module of a checkpoint."""
    out = {}
    for module, scheme in quantized_modules(config, tensors).items():
        prefix = module + "."
        stored = {n[len(prefix):]: t for n, t in tensors.items()
                  if n.startswith(prefix) and n[len(prefix):] in _CT_SUFFIXES + ("weight", "weight_scale_inv")}
        out[module + ".weight"] = dequantize(stored, scheme)
    return out


def dequantized_checkpoint(config: dict, tensors: dict) -> dict:
    """The checkpoint with every quantized module's stored tensors replaced by "<module>.weight" (float64,
    dequantize); other tensors unchanged."""
    decoded = decode_checkpoint(config, tensors)
    stored = {m[:-len("weight")] + suffix for m in decoded for suffix in _CT_SUFFIXES + ("weight", "weight_scale_inv")}
    out = {n: t for n, t in tensors.items() if n not in stored}
    out.update(decoded)
    return out


# ---------------------------------------------------------------------------------------------------
# CLI

def _read_dir(path: str) -> tuple:
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    return config, read_checkpoint(path)


_ELEMENT_DTYPE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                  "I8": "i1", "U8": "u1", "BOOL": "u1", "F8_E4M3": "u1", "F8_E5M2": "u1"}


def _describe(tag: str, raw) -> str:
    if tag == "BF16":
        value = float(torch.tensor([int(raw)], dtype=torch.int32).to(torch.int16).view(torch.bfloat16))
        return f"0x{int(raw):04x} ({value:.9g})"
    if tag == "F8_E4M3":
        return f"0x{int(raw):02x} ({float(e4m3_decode(torch.tensor([int(raw)]))[0]):g})"
    if tag == "I32":
        return f"{int(raw)} (0x{int(raw) & 0xFFFFFFFF:08x})"
    if tag == "U8":
        return f"0x{int(raw):02x}"
    return repr(raw.item() if hasattr(raw, "item") else raw)


def first_difference(expected, actual) -> Optional[str]:
    """None when both tensors have the same dtype, shape and bytes; else what differs (first element)."""
    te, ta = dtype_tag(expected), dtype_tag(actual)
    if te != ta:
        return f"dtype {ta}, expected {te}"
    if list(expected.shape) != list(actual.shape):
        return f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    be, ba = tensor_bytes(expected), tensor_bytes(actual)
    if be == ba:
        return None
    ae, aa = np.frombuffer(be, dtype=_ELEMENT_DTYPE[te]), np.frombuffer(ba, dtype=_ELEMENT_DTYPE[te])
    bad = np.flatnonzero(ae != aa)
    index = tuple(int(i) for i in np.unravel_index(int(bad[0]), tuple(expected.shape))) if expected.shape else ()
    return (f"{len(bad)} of {ae.size} elements differ; first at {list(index)}: {_describe(te, aa[bad[0]])}, "
            f"expected {_describe(te, ae[bad[0]])}")


def compare(args) -> int:
    ignore = args.ignore if args.ignore else list(DEFAULT_IGNORE)
    scheme = make_scheme(args.scheme, args.group)
    if scheme.hf:
        print("compare: HF_FP8 is a format lineage reads, not one it writes", file=sys.stderr)
        return 2
    print(f"scheme {scheme.preset} ({scheme.format}, {scheme.num_bits}-bit {scheme.type} {scheme.strategy}"
          f"{f' {scheme.group_size}' if scheme.group_size else ''}"
          f"{f' {list(scheme.block_structure)}' if scheme.block_structure else ''})")
    print(f"ignore {'(default) ' if not args.ignore else ''}{json.dumps(ignore)}")
    in_config, src = _read_dir(args.input)
    out_config, dst = _read_dir(args.output)
    if "quantization_config" in in_config:
        print(f"compare: {args.input} is already quantized", file=sys.stderr)
        return 2
    modules = plan(src, [(scheme, ["Linear"])], ignore)
    try:
        expected = quantize_checkpoint(src, modules)
    except ValueError as e:
        print(f"compare: cannot quantize {args.input} with {scheme.preset}: {e}", file=sys.stderr)
        return 2
    print(f"{len(modules)} matrices to quantize, {len(src) - len(modules)} tensors to copy")
    failures = []
    for name in sorted(expected):
        if name not in dst:
            failures.append(f"'{name}' is missing from {args.output}")
            continue
        problem = first_difference(expected[name], dst[name])
        if problem:
            what = "quantized" if name not in src else "copied"
            failures.append(f"'{name}' ({what}): {problem}")
    extra = sorted(set(dst) - set(expected))
    failures += [f"'{name}' is in {args.output} but not expected" for name in extra]
    q_expected = quantization_config(scheme, None, ignore)
    q_actual = out_config.get("quantization_config")
    notes = []
    if q_actual is None:
        failures.append("config.json has no quantization_config")
    else:
        semantic, other = config_differences(q_expected, q_actual)
        failures += [f"quantization_config.{m}" for m in (semantic + other if args.strict_config else semantic)]
        notes += [] if args.strict_config else [f"quantization_config.{m}" for m in other]
    rest_in = {k: v for k, v in in_config.items() if k != "quantization_config"}
    rest_out = {k: v for k, v in out_config.items() if k != "quantization_config"}
    notes += [f"config.json '{k}': {rest_out.get(k, '<absent>')!r}, input {rest_in.get(k, '<absent>')!r}"
              for k in sorted(set(rest_in) | set(rest_out)) if rest_in.get(k) != rest_out.get(k)]
    for n in notes:
        print(f"note: {n}")
    if failures:
        print(f"MISMATCH: {failures[0]}", file=sys.stderr)
        if len(failures) > 1:
            print(f"({len(failures) - 1} more problems; next: {failures[1]})", file=sys.stderr)
        return 1
    print(f"OK: {len(modules)} quantized matrices and {len(src) - len(modules)} copied tensors byte-equal, "
          "quantization_config matches")
    return 0


def decode(args) -> int:
    config, tensors = _read_dir(args.model)
    decoded = decode_checkpoint(config, tensors)
    if not decoded:
        print(f"decode: {args.model} has no quantized matrices", file=sys.stderr)
        return 1
    np.savez(args.out, **{name: t.numpy() for name, t in sorted(decoded.items())})
    print(f"{len(decoded)} matrices -> {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="check a `lineage quantize` output against this reference")
    c.add_argument("--input", required=True, help="the float HF model directory that was quantized")
    c.add_argument("--output", required=True, help="the quantized directory to check")
    c.add_argument("--scheme", required=True,
                   help="W4A16 | W4A16_ASYM | W8A16 | FP8_BLOCK | FP8_DYNAMIC | MXFP4 | NVFP4")
    c.add_argument("--group", help="int schemes: group size, or 'channel'")
    c.add_argument("--ignore", action="append", default=[],
                   help="module to leave unquantized: exact name or re:<regex> (repeatable; default list if none)")
    c.add_argument("--strict-config", action="store_true",
                   help="also fail on quantization_config fields that do not change meaning (observer, version...)")
    d = sub.add_parser("decode", help="write every quantized matrix dequantized (float64) to an .npz")
    d.add_argument("--model", required=True)
    d.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return compare(args) if args.command == "compare" else decode(args)


if __name__ == "__main__":
    sys.exit(main())
