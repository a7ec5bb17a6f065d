"""Tests of compressed_tensors.py: number formats against hand-computed bytes (E4M3 / E2M1 / E8M0 edge cases,
ties, subnormals, NaN), pack_int32 against hand-computed words, quantize bit for bit against a second,
independent implementation that computes the way compressed-tensors does (torch tensor arithmetic in the
weight's own dtype, bf16 included, and the library's threshold / bit-trick formulations), that the bf16 step
rounding matters, dequantize, configs, and the compare / decode CLI.
Run: /usr/bin/python3 -m pytest -q -p no:cacheprovider reference/test_compressed_tensors.py"""

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compressed_tensors as ct  # noqa: E402
from safetensors_io import RawTensor, read_safetensors, write_safetensors  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32


def codes(t):
    return (t.data if isinstance(t, RawTensor) else t).clone()


# ---------------------------------------------------------------------------------------------------
# Number formats

def test_e4m3_known_bytes():
    cases = [(448.0, 0x7E), (-448.0, 0xFE), (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-1.0, 0xB8),
             (2.0 ** -9, 0x01), (7 * 2.0 ** -9, 0x07), (2.0 ** -6, 0x08), (0.5, 0x30), (240.0, 0x77), (256.0, 0x78),
             (1.0625, 0x38),            # tie between 1 and 1.125 -> even mantissa (1.0)
             (1.1875, 0x3A),            # tie between 1.125 and 1.25 -> 1.25
             (1.5 * 2.0 ** -9, 0x02),   # subnormal tie -> even (2 x 2^-9)
             (0.5 * 2.0 ** -9, 0x00),   # half the smallest subnormal: tie -> 0
             (-0.5 * 2.0 ** -9, 0x80),
             (0.75 * 2.0 ** -9, 0x01), (15 * 2.0 ** -10, 0x08),   # rounds up out of the subnormals
             (456.0, 0x7E), (463.9, 0x7E),                         # nearest 448
             (464.0, 0x7F),             # the 448 / 480 midpoint: NaN, as torch's cast (no 480 in e4m3fn)
             (500.0, 0x7F), (-1e9, 0xFF), (math.inf, 0x7F), (math.nan, 0x7F)]
    got = ct.e4m3_encode(torch.tensor([v for v, _ in cases], dtype=torch.float64)).tolist()
    for (value, want), byte in zip(cases, got):
        assert byte == want, f"{value}: 0x{byte:02x}, expected 0x{want:02x}"
    dec = ct.e4m3_decode(torch.tensor([0x7E, 0xFE, 0x01, 0x08, 0x38, 0x00, 0x80, 0x7F, 0xFF]))
    assert dec[:6].tolist() == [448.0, -448.0, 2.0 ** -9, 2.0 ** -6, 1.0, 0.0]
    assert math.copysign(1.0, float(dec[6])) == -1.0 and math.isnan(dec[7]) and math.isnan(dec[8])


def test_e4m3_round_trip_and_nearest_even():
    finite = [c for c in range(256) if c & 0x7F != 0x7F]
    all_codes = torch.tensor(finite)
    assert ct.e4m3_encode(ct.e4m3_decode(all_codes)).tolist() == finite
    # Brute force: nearest finite magnitude, ties to the even code, over random values and every midpoint.
    mags = ct.e4m3_decode(torch.arange(0x7F)).tolist()
    mids = [(a + b) / 2 for a, b in zip(mags, mags[1:])]
    rng = np.random.RandomState(0)
    values = mids + list(rng.uniform(0, 460, 2000)) + list(2.0 ** rng.uniform(-12, 8.8, 2000))
    for v in values:
        d = [abs(v - m) for m in mags]
        best = min(d)
        want = min((c for c in range(0x7F) if d[c] == best), key=lambda c: (c & 1, c))
        for sign in (1, -1):
            got = int(ct.e4m3_encode(torch.tensor([sign * v], dtype=torch.float64))[0])
            assert got == want | (0x80 if sign < 0 else 0), (v, got, want)


def test_e2m1_known_codes():
    cases = [(0.0, 0x0), (-0.0, 0x0), (0.25, 0x0), (0.2500001, 0x1), (0.5, 0x1), (0.75, 0x2), (1.25, 0x2),
             (1.2500001, 0x3), (1.75, 0x4), (2.5, 0x4), (2.5000001, 0x5), (3.5, 0x6), (5.0, 0x6), (5.0000001, 0x7),
             (6.0, 0x7), (7.0, 0x7), (-0.1, 0x8), (-0.25, 0x8), (-0.3, 0x9), (-3.0, 0xD), (-6.0, 0xF), (-100.0, 0xF)]
    got = ct.e2m1_encode(torch.tensor([v for v, _ in cases], dtype=torch.float64)).tolist()
    assert got == [c for _, c in cases]
    values = ct.e2m1_decode(torch.arange(16))
    assert values.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert math.copysign(1.0, float(values[8])) == -1.0


def test_e8m0():
    assert ct.e8m0_decode(torch.tensor([127, 0, 1, 254, 130])).tolist() == [1.0, 2.0 ** -127, 2.0 ** -126,
                                                                           2.0 ** 127, 8.0]
    assert math.isnan(float(ct.e8m0_decode(torch.tensor([255]))[0]))
    assert ct.e8m0_encode(torch.tensor([1.0, 2.0 ** -127, 2.0 ** 127, 0.25])).tolist() == [127, 0, 254, 125]
    with pytest.raises(ValueError):
        ct.e8m0_encode(torch.tensor([3.0]))


def test_round_to_grids():
    x = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 2.0 ** -133, 2.0 ** -134, 3 * 2.0 ** -135, 1e39],
                     dtype=torch.float64)
    # bf16: ties to even at 1 + 2^-8 (-> 1) and 1 + 3 2^-8 (-> 1 + 2^-6); subnormal 2^-133 kept, 2^-134 a tie
    # to 0, 3 2^-135 = 0.75 2^-133 up to 2^-133; overflow to inf.
    assert ct.round_to(x, BF16).tolist() == [1.0, 1 + 2 ** -6, 2.0 ** -133, 0.0, 2.0 ** -133, math.inf]
    assert torch.equal(ct.round_to(x[:5], BF16), x[:5].to(torch.float32).to(BF16).to(torch.float64))


# ---------------------------------------------------------------------------------------------------
# Packing

def test_pack_int32_hand_words():
    q = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [-8, -8, -8, -8, -8, -8, -8, 7]])
    words = ct.pack_int32(q, 4)
    assert words.dtype == torch.int32 and words.tolist() == [[0xFEDCBA98 - 2 ** 32], [0xF0000000 - 2 ** 32]]
    # As little-endian bytes: byte k = u[2k] | u[2k+1] << 4 (the MXFP4 nibble order).
    assert list(words[0].numpy().astype("<i4").tobytes()) == [0x98, 0xBA, 0xDC, 0xFE]
    # int8: four per word, element i at bits 8i.
    assert ct.pack_int32(torch.tensor([[-128, -1, 0, 127]]), 8).tolist() == [[0xFF807F00 - 2 ** 32]]
    # int3: 11 codes take 33 bits; element 10 straddles words 0 and 1.
    q3 = torch.full((1, 11), -4)
    q3[0, 10] = 3
    assert ct.pack_int32(q3, 3).tolist() == [[-(2 ** 30), 1]]
    # cols not a multiple of 8: 12 int4 codes -> 2 words, the unused high half zero.
    q12 = torch.arange(12).reshape(1, 12) - 8
    assert ct.pack_int32(q12, 4).tolist() == [[0x76543210, 0x0000BA98]]
    for bits in range(1, 9):
        q = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (5, 37))
        assert torch.equal(ct.unpack_int32(ct.pack_int32(q, bits), bits, 37), q)


def test_zero_point_packed_along_dim0():
    w = torch.randn(9, 64).to(BF16) + 0.3
    out = ct.quantize(w, "W4A16_ASYM", 32)
    zp_words = out["weight_zero_point"]
    assert zp_words.dtype == torch.int32 and list(zp_words.shape) == [2, 2]    # ceil(9 * 4 / 32) x 2 groups
    # Hand: column g of the words packs rows 0..8 of group g's zero points (u = zp + 8), row 8 in word 1.
    zp = ct.unpack_int32(zp_words.T.contiguous(), 4, 9).T                    # [9, 2]
    for g in range(2):
        u = [int(z) + 8 for z in zp[:, g]]
        word0 = sum(u[i] << (4 * i) for i in range(8))
        assert int(zp_words[0, g]) & 0xFFFFFFFF == word0 and int(zp_words[1, g]) == u[8]


def test_nibbles():
    c = torch.tensor([[1, 2, 15, 8]])
    assert ct.pack_nibbles(c).tolist() == [[0x21, 0x8F]]
    assert torch.equal(ct.unpack_nibbles(ct.pack_nibbles(c)), c)


# ---------------------------------------------------------------------------------------------------
# A second implementation of the quantizers, computing as compressed-tensors does: torch arithmetic in the
# weight's dtype (bf16 tensors divide / add / subtract in bf16), the library's FP4 thresholds, its MX
# power-of-two bit trick, an FP8 cast by exhaustive nearest-even search.

_E4M3_MAGS = None


def _fp8_cast(t: torch.Tensor) -> torch.Tensor:
    """Nearest-even E4M3 code of each value (|t| <= 448) by exhaustive search."""
    global _E4M3_MAGS
    if _E4M3_MAGS is None:
        _E4M3_MAGS = ct.e4m3_decode(torch.arange(0x7F))
    v = t.to(torch.float64).reshape(-1, 1)
    d = (v.abs() - _E4M3_MAGS.reshape(1, -1)).abs()
    best = d.min(dim=1, keepdim=True).values
    cand = torch.where(d == best, torch.arange(0x7F) + 1000 * (torch.arange(0x7F) & 1), torch.full_like(d, 10 ** 6,
                                                                                                  dtype=torch.int64))
    code = cand.min(dim=1).values % 1000
    return (code | (torch.signbit(v[:, 0]).to(torch.int64) << 7)).to(torch.uint8).reshape(t.shape)


def _fp4_cast_codes(x: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' cast_to_fp4 thresholds, then its signbit / x*2 index packing (codes, not packed)."""
    sign = torch.sign(x)
    a = x.abs().clone()
    a[(a >= 0.0) & (a <= 0.25)] = 0.0
    a[(a > 0.25) & (a < 0.75)] = 0.5
    a[(a >= 0.75) & (a <= 1.25)] = 1.0
    a[(a > 1.25) & (a < 1.75)] = 1.5
    a[(a >= 1.75) & (a <= 2.5)] = 2.0
    a[(a > 2.5) & (a < 3.5)] = 3.0
    a[(a >= 3.5) & (a <= 5.0)] = 4.0
    a[a > 5.0] = 6.0
    v = a * sign
    doubled = (v * 2).to(torch.int8).abs().to(torch.int64)
    index = torch.zeros_like(doubled)
    for code, twice in enumerate((0, 1, 2, 3, 4, 6, 8, 12)):
        index[doubled == twice] = code
    return index | (torch.signbit(v).to(torch.int64) << 3)


def _mirror_int(w: torch.Tensor, bits: int, group, sym: bool) -> tuple:
    rows, cols = w.shape
    gs = cols if group == "channel" else group
    x = w.reshape(rows, cols // gs, gs)
    mn = torch.min(x.amin(dim=-1), torch.zeros(1, dtype=w.dtype))
    mx = torch.max(x.amax(dim=-1), torch.zeros(1, dtype=w.dtype))
    q_min, q_max = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if sym:
        scale = torch.max(mn.abs(), mx) / (float(2 ** bits - 1) / 2)
        zp = torch.zeros_like(scale)
    else:
        scale = (mx - mn) / float(2 ** bits - 1)
        zp = torch.clamp(torch.tensor(float(q_min)) - mn / scale, q_min, q_max)
    scale = torch.where(scale == 0, torch.tensor(torch.finfo(w.dtype).eps, dtype=w.dtype), scale)
    zp8 = torch.round(torch.clamp(zp, -128, 127)).to(torch.int8)
    t = x / scale[..., None]
    if not sym:
        t = t + zp8.to(w.dtype)[..., None]
    q = torch.round(torch.clamp(t, q_min, q_max)).to(torch.int64).reshape(rows, cols)
    return q, scale, zp8


def _mirror_fp8(w: torch.Tensor, block) -> tuple:
    rows, cols = w.shape
    if block is None:
        scale = w.abs().amax(dim=1, keepdim=True) / 448.0
        full = scale
    else:
        bh, bw = block
        nr, nc = -(-rows // bh), -(-cols // bw)
        padded = torch.zeros(nr * bh, nc * bw, dtype=w.dtype)
        padded[:rows, :cols] = w
        scale = padded.reshape(nr, bh, nc, bw).abs().amax(dim=(1, 3)) / 448.0
        full = scale.repeat_interleave(bh, 0).repeat_interleave(bw, 1)[:rows, :cols]
    eps = torch.finfo(w.dtype).eps
    scale = torch.where(scale == 0, torch.tensor(eps, dtype=w.dtype), scale)
    full = torch.where(full == 0, torch.tensor(eps, dtype=w.dtype), full)
    return _fp8_cast(torch.clamp(w / full, -448.0, 448.0)), scale


def _mirror_mxfp4(w: torch.Tensor) -> tuple:
    rows, cols = w.shape
    x = w.reshape(rows, cols // 32, 32)
    amax = torch.max(torch.min(x.amin(-1), torch.zeros(1, dtype=w.dtype)).abs(),
                     torch.max(x.amax(-1), torch.zeros(1, dtype=w.dtype)))
    if w.dtype == BF16:
        bits = amax.view(torch.int16).to(torch.int32) & 0xFFFF
        p2 = ((bits + (1 << 5)) & (0x1FF << 7)).to(torch.int16).view(BF16)
    else:
        bits = amax.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        p2 = ((bits + (1 << 21)) & (0x1FF << 23)).to(torch.int32).view(F32)
    s = torch.round(torch.clamp(127 + torch.floor(torch.log2(p2)) - 2, 0, 255)).to(torch.uint8)
    scale = (2.0 ** (s.to(torch.int32) - 127).to(torch.float)).to(w.dtype)
    t = torch.clamp(x / scale[..., None], -6.0, 6.0).reshape(rows, cols)
    return _fp4_cast_codes(t), s


def _mirror_nvfp4(w: torch.Tensor, global_amax=None) -> tuple:
    rows, cols = w.shape
    gmax = w.abs().max() if global_amax is None else torch.tensor(global_amax, dtype=w.dtype)
    gmax = torch.clamp(gmax, min=torch.finfo(w.dtype).tiny)
    g = (torch.reciprocal(gmax) * 2688.0).to(F32).reshape([1])     # shape [1]: g * bf16 promotes to f32
    if not bool(torch.isfinite(g)):
        g = torch.tensor([1.0])
    x = w.reshape(rows, cols // 16, 16)
    amax = torch.max(torch.min(x.amin(-1), torch.zeros(1, dtype=w.dtype)).abs(),
                     torch.max(x.amax(-1), torch.zeros(1, dtype=w.dtype)))
    s1 = g * (amax / 6.0)                                        # bf16 / 6 in bf16, then times the f32 global
    s2 = ct.e4m3_decode(_fp8_cast(torch.clamp(s1, -448.0, 448.0))).to(F32)
    s2 = torch.where(s2 == 0, torch.tensor(0.125), s2)
    eff = s2 / g
    t = torch.clamp(x.to(F32) / eff[..., None], -6.0, 6.0).reshape(rows, cols)
    return _fp4_cast_codes(t), s2, g


def _test_weights(dtype, rows=24, cols=256, seed=0):
    """Random weights plus rows built to hit rounding ties, an all-zero group, a negative zero and a group whose
    values are all positive or all negative."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen)
    w[1, :32] = torch.tensor([7.5, 0.5, 1.5, 2.5, -3.5, -0.5, 4.5, -6.5] * 4)        # int4: scale 1, ties
    w[2, :32] = torch.tensor([127.5, 0.5, 1.5, -2.5, 100.5, -0.5, 63.5, 3.5] * 4)    # int8: scale 1, ties
    w[3, :32] = 0.0
    w[3, 5] = -0.0
    w[4, :32] = torch.tensor([448.0, 1.0625, 1.1875, -2.125, 3 * 2.0 ** -9, 2.0 ** -10, 300.0, -456.0] * 4) / 448
    w[5, :32] = torch.rand(32, generator=gen) + 0.25                                     # all positive
    w[6, :32] = -torch.rand(32, generator=gen) - 0.25                                    # all negative
    w[7, :32] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 4)          # fp4 ties at scale 1
    w[8, 32:64] = w[8, 32:64] * 1e-3
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("bits,group,sym", [(4, 32, True), (4, 128, True), (4, "channel", True), (4, 32, False),
                                            (8, 128, True), (8, 32, False), (4, "channel", False)])
def test_int_bit_exact_vs_mirror(dtype, bits, group, sym):
    w = _test_weights(dtype)
    preset = {4: "W4A16", 8: "W8A16"}[bits] if sym else "W4A16_ASYM"
    scheme = ct.make_scheme(preset, group)
    if bits == 8 and not sym:
        scheme = ct.Scheme("custom", 8, "int", False, "group", 32)
    out = ct.quantize(w, scheme)
    q, scale, zp = _mirror_int(w, bits, group, sym)
    assert torch.equal(ct.unpack_int32(out["weight_packed"], bits, w.shape[1]), q)
    assert out["weight_scale"].dtype == dtype and torch.equal(out["weight_scale"], scale)
    assert out["weight_shape"].tolist() == list(w.shape) and out["weight_shape"].dtype == torch.int64
    if not sym:
        stored_zp = ct.unpack_int32(out["weight_zero_point"].T.contiguous(), bits, w.shape[0]).T
        assert torch.equal(stored_zp, zp.to(torch.int64))
    else:
        assert "weight_zero_point" not in out


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("preset", ["FP8_BLOCK", "FP8_DYNAMIC"])
def test_fp8_bit_exact_vs_mirror(dtype, preset):
    w = _test_weights(dtype, rows=200, cols=192)      # partial [128, 128] blocks in both dims
    out = ct.quantize(w, preset)
    q, scale = _mirror_fp8(w, (128, 128) if preset == "FP8_BLOCK" else None)
    assert isinstance(out["weight"], RawTensor) and out["weight"].tag == "F8_E4M3"
    assert torch.equal(codes(out["weight"]), q)
    assert out["weight_scale"].dtype == dtype and torch.equal(out["weight_scale"], scale)
    assert list(scale.shape) == ([2, 2] if preset == "FP8_BLOCK" else [200, 1])


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_mxfp4_bit_exact_vs_mirror(dtype):
    w = _test_weights(dtype)
    w[9, :32] = torch.tensor([1.75, 1.7, 0.1, -1.0] * 8).to(dtype)     # pow2round: 1.75 rounds up, 1.7 down
    w[10, :32] = (torch.tensor([1.5] * 32) * 2.0 ** -130).to(dtype)    # subnormal group max
    out = ct.quantize(w, "MXFP4")
    q, s = _mirror_mxfp4(w)
    assert out["weight_packed"].dtype == torch.uint8 and list(out["weight_packed"].shape) == [24, 128]
    assert torch.equal(ct.unpack_nibbles(out["weight_packed"]), q)
    assert out["weight_scale"].dtype == torch.uint8 and torch.equal(out["weight_scale"], s)
    assert int(out["weight_scale"][3, 0]) == 0          # all-zero group: E8M0 byte 0


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("fused", [None, 200.0])
def test_nvfp4_bit_exact_vs_mirror(dtype, fused):
    w = _test_weights(dtype)
    out = ct.quantize(w, "NVFP4", fused_global_amax=fused)
    q, s2, g = _mirror_nvfp4(w, fused)
    assert torch.equal(ct.unpack_nibbles(out["weight_packed"]), q)
    assert out["weight_global_scale"].dtype == F32 and float(out["weight_global_scale"][0]) == float(g)
    assert torch.equal(ct.e4m3_decode(codes(out["weight_scale"])).to(F32), s2)
    assert list(out["weight_scale"].shape) == [24, 16]


def test_nvfp4_global_scale_rounds_twice_in_bf16():
    # 2688 * reciprocal(amax), each step rounded to bf16, differs from one f32 division for some amax.
    diffs = 0
    for i in range(1, 400):
        a = float(torch.tensor(0.37 + i * 0.011).to(BF16))
        g = ct.nvfp4_global_scale(a, BF16)
        assert g == float((torch.reciprocal(torch.tensor(a, dtype=BF16)) * 2688.0).float())
        diffs += g != float(torch.tensor(2688.0 / a, dtype=F32))
    assert diffs > 0


def test_bf16_step_rounding_changes_codes():
    """Rounding every step to bf16 (the reference) differs from computing in f32 on bf16 weights."""
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(7)).to(BF16)
    for preset, group in (("W4A16", 128), ("W8A16", 128), ("W4A16_ASYM", 128)):
        bits = 8 if preset == "W8A16" else 4
        exact = ct.unpack_int32(ct.quantize(w, preset, group)["weight_packed"], bits, 256)
        f32 = ct.unpack_int32(ct.quantize(w, preset, group, arith_dtype=F32)["weight_packed"], bits, 256)
        assert int((exact != f32).sum()) > 0, preset


def test_asym_all_zero_group():
    w = torch.randn(4, 64).to(BF16)
    w[2, 32:] = 0.0
    out = ct.quantize(w, "W4A16_ASYM", 32)
    zp = ct.unpack_int32(out["weight_zero_point"].T.contiguous(), 4, 4).T
    q = ct.unpack_int32(out["weight_packed"], 4, 64)
    assert int(zp[2, 1]) == 0 and float(out["weight_scale"][2, 1]) == 2.0 ** -7
    assert bool((q[2, 32:] == 0).all())
    assert bool((ct.dequantize(out, ct.make_scheme("W4A16_ASYM", 32))[2, 32:] == 0).all())


def test_actorder_g_idx():
    w = torch.randn(8, 64).to(BF16)
    g = torch.tensor([1, 0] * 32, dtype=torch.int32)
    scheme = ct.make_scheme("W4A16", 32, "group")
    out = ct.quantize(w, scheme, g_idx=g)
    assert torch.equal(out["weight_g_idx"], g)
    # Same as quantizing the columns sorted by group with plain groups of 32.
    order = torch.argsort(g.to(torch.int64), stable=True)
    plain = ct.quantize(w[:, order], "W4A16", 32)
    assert torch.equal(out["weight_scale"], plain["weight_scale"])
    deq = ct.dequantize(out, scheme)
    assert torch.equal(deq[:, order], ct.dequantize(plain, ct.make_scheme("W4A16", 32)))


# ---------------------------------------------------------------------------------------------------
# Dequantization

def test_dequantize_definitions():
    w = _test_weights(BF16)
    # int with bf16 scales: (q - zp) scale exactly.
    s = ct.make_scheme("W4A16_ASYM", 32)
    out = ct.quantize(w, s)
    q = ct.unpack_int32(out["weight_packed"], 4, 256).double()
    zp = ct.unpack_int32(out["weight_zero_point"].T.contiguous(), 4, 24).T.double()
    want = (q - zp.repeat_interleave(32, 1)) * out["weight_scale"].double().repeat_interleave(32, 1)
    assert torch.equal(ct.dequantize(out, s), want)
    # int with f32 scales: the product rounded once to f32.
    w32 = _test_weights(F32)
    out = ct.quantize(w32, "W4A16", 32)
    q = ct.unpack_int32(out["weight_packed"], 4, 256).to(F32)
    want = (q * out["weight_scale"].repeat_interleave(32, 1)).double()
    assert torch.equal(ct.dequantize(out, ct.make_scheme("W4A16", 32)), want)
    # NVFP4: (scale / global) in f32, times the code value in f32.
    out = ct.quantize(w, "NVFP4")
    vals = ct.e2m1_decode(ct.unpack_nibbles(out["weight_packed"])).to(F32)
    eff = ct.e4m3_decode(codes(out["weight_scale"])).to(F32) / out["weight_global_scale"]
    assert torch.equal(ct.dequantize(out, "NVFP4"), (vals * eff.repeat_interleave(16, 1)).double())
    # MXFP4: e2m1 2^(s - 127).
    out = ct.quantize(w, "MXFP4")
    vals = ct.e2m1_decode(ct.unpack_nibbles(out["weight_packed"]))
    want = vals * torch.pow(2.0, out["weight_scale"].double() - 127).repeat_interleave(32, 1)
    assert torch.equal(ct.dequantize(out, "MXFP4"), want)
    # HF fp8 with f32 scale_inv: multiplies.
    out = ct.quantize(w, "HF_FP8", scale_dtype=F32)
    assert set(out) == {"weight", "weight_scale_inv"} and out["weight_scale_inv"].dtype == F32
    q = ct.e4m3_decode(codes(out["weight"])).to(F32)
    scale = out["weight_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)[:24]
    assert list(out["weight_scale_inv"].shape) == [1, 2]
    assert torch.equal(ct.dequantize(out, "HF_FP8"), (q * scale).double())


@pytest.mark.parametrize("preset,group,bound", [("W4A16", 32, 0.12), ("W4A16_ASYM", 32, 0.1), ("W8A16", 128, 0.01),
                                                ("FP8_BLOCK", None, 0.04), ("FP8_DYNAMIC", None, 0.04),
                                                ("MXFP4", None, 0.15), ("NVFP4", None, 0.12)])
def test_round_trip_through_safetensors(preset, group, bound):
    w = torch.randn(40, 128, generator=torch.Generator().manual_seed(3)).to(BF16)
    out = ct.quantize(w, preset, group)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.safetensors")
        write_safetensors(path, {f"m.{k}": v for k, v in out.items()})
        back = {k[2:]: v for k, v in read_safetensors(path).items()}
    for k, v in out.items():
        assert ct.first_difference(v, back[k]) is None, k
    deq = ct.dequantize(back, ct.make_scheme(preset, group))
    err = float((deq - w.double()).norm() / w.double().norm())
    assert 0 < err < bound, (preset, err)


# ---------------------------------------------------------------------------------------------------
# Configs

def test_quantization_config_w4a16():
    qc = ct.quantization_config("W4A16", 32, ["lm_head"])
    assert qc == {
        "config_groups": {"group_0": {
            "format": "pack-quantized", "input_activations": None, "output_activations": None, "targets": ["Linear"],
            "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                        "observer": "minmax", "observer_kwargs": {}, "scale_dtype": None, "strategy": "group",
                        "symmetric": True, "type": "int", "zp_dtype": None}}},
        "format": "pack-quantized", "global_compression_ratio": None, "ignore": ["lm_head"], "kv_cache_scheme": None,
        "quant_method": "compressed-tensors", "quantization_status": "compressed", "transform_config": {},
        "version": ct.CT_VERSION}
    fp8 = ct.quantization_config("FP8_BLOCK", None, [])
    g = fp8["config_groups"]["group_0"]
    assert fp8["format"] == "float-quantized" and g["weights"]["block_structure"] == [128, 128]
    assert g["input_activations"]["dynamic"] is True and g["input_activations"]["group_size"] == 128
    assert ct.quantization_config("MXFP4", None, [])["format"] == "mxfp4-pack-quantized"
    nv = ct.quantization_config("NVFP4", None, [])["config_groups"]["group_0"]["weights"]
    assert (nv["strategy"], nv["group_size"], nv["scale_dtype"]) == ("tensor_group", 16, "torch.float8_e4m3fn")
    asym = ct.quantization_config("W4A16_ASYM", None, [])["config_groups"]["group_0"]["weights"]
    assert (asym["symmetric"], asym["zp_dtype"], asym["group_size"]) == (False, "torch.int8", 128)
    mixed = ct.quantization_config_groups([("W4A16", ["re:a"]), ("FP8_BLOCK", ["re:b"])], [])
    assert mixed["format"] == "mixed-precision" and list(mixed["config_groups"]) == ["group_0", "group_1"]
    semantic, other = ct.config_differences(qc, {**qc, "version": "0.9", "config_groups": {"group_0": {
        **qc["config_groups"]["group_0"], "weights": {**qc["config_groups"]["group_0"]["weights"],
                                                      "observer": "memoryless_minmax"}}}})
    assert semantic == [] and len(other) == 2
    semantic, _ = ct.config_differences(qc, ct.quantization_config("W4A16", 128, ["lm_head"]))
    assert semantic == ["config_groups.group_0.weights.group_size: 128, expected 32"]


def test_plan_and_fused_sets():
    t = {n: torch.zeros(4, 32) for n in ("model.embed_tokens.weight", "lm_head.weight", "a.self_attn.q_proj.weight",
                                         "a.self_attn.k_proj.weight", "a.mlp.gate.weight",
                                         "a.mlp.experts.0.gate_proj.weight", "a.mlp.experts.0.up_proj.weight")}
    t["a.input_layernorm.weight"] = torch.zeros(32)
    p = ct.plan(t, [("NVFP4", ["Linear"])], ct.DEFAULT_IGNORE)
    assert sorted(p) == ["a.mlp.experts.0.gate_proj", "a.mlp.experts.0.up_proj", "a.self_attn.k_proj",
                         "a.self_attn.q_proj"]
    keys = ct.fused_sets(p)
    assert keys["a.self_attn.q_proj"] == keys["a.self_attn.k_proj"] != keys["a.mlp.experts.0.up_proj"]
    w = {n: torch.randn(4, 32).to(BF16) for n in t if n.endswith("proj.weight")}
    w["a.self_attn.k_proj.weight"] = w["a.self_attn.k_proj.weight"] * 3
    out = ct.quantize_checkpoint(w, p)
    assert float(out["a.self_attn.q_proj.weight_global_scale"]) == float(out["a.self_attn.k_proj.weight_global_scale"])


# ---------------------------------------------------------------------------------------------------
# CLI

def _float_model(d: str) -> dict:
    gen = torch.Generator().manual_seed(11)
    tensors = {
        "model.embed_tokens.weight": torch.randn(50, 64, generator=gen),
        "model.layers.0.input_layernorm.weight": torch.randn(64, generator=gen),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(96, 64, generator=gen),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(32, 64, generator=gen),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(32, 64, generator=gen),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(64, 128, generator=gen),
        "model.layers.0.mlp.gate.weight": torch.randn(4, 64, generator=gen),
        "model.layers.0.linear_attn.conv1d.weight": torch.randn(8, 1, 4, generator=gen),
        "model.layers.0.linear_attn.A_log": torch.randn(4, generator=gen),
        "model.norm.weight": torch.randn(64, generator=gen),
        "lm_head.weight": torch.randn(50, 64, generator=gen),
    }
    tensors = {k: v.to(BF16) for k, v in tensors.items()}
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "toy", "torch_dtype": "bfloat16"}, f)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    return tensors


def _lineage_like(src: dict, d: str, scheme, group=None, ignore=None) -> dict:
    """What lineage quantize should write, built with this library (a stand-in for the C++ output)."""
    ignore = ct.DEFAULT_IGNORE if ignore is None else ignore
    s = ct.make_scheme(scheme, group)
    out = ct.quantize_checkpoint(src, ct.plan(src, [(s, ["Linear"])], ignore))
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "toy", "torch_dtype": "bfloat16",
                   "quantization_config": ct.quantization_config(s, None, ignore)}, f, indent=2, sort_keys=True)
    write_safetensors(os.path.join(d, "model.safetensors"), out, {"format": "pt"})
    return out


def _cli(*args, subprocess_run=False):
    """Runs the CLI (in this process unless subprocess_run): (returncode, stdout, stderr) as a CompletedProcess."""
    if subprocess_run:
        return subprocess.run([sys.executable, os.path.join(HERE, "compressed_tensors.py"), *args],
                              capture_output=True, text=True)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = ct.main(list(args))
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("scheme,group", [("W4A16", "32"), ("W4A16_ASYM", "32"), ("W8A16", "64"),
                                          ("FP8_BLOCK", None), ("MXFP4", None), ("NVFP4", None)])
def test_cli_compare_and_decode(scheme, group):
    with tempfile.TemporaryDirectory() as d:
        src = _float_model(os.path.join(d, "in"))
        out = _lineage_like(src, os.path.join(d, "out"), scheme, group)
        g = ["--group", group] if group else []
        r = _cli("compare", "--input", os.path.join(d, "in"), "--output", os.path.join(d, "out"), "--scheme", scheme,
                 *g, subprocess_run=scheme == "W4A16")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "OK:" in r.stdout and "re:.*embed_tokens$" in r.stdout
        npz = os.path.join(d, "w.npz")
        r = _cli("decode", "--model", os.path.join(d, "out"), "--out", npz)
        assert r.returncode == 0, r.stderr
        decoded = np.load(npz)
        assert sorted(decoded.files) == [f"model.layers.0.self_attn.{p}_proj.weight" for p in "koqv"]
        s = ct.make_scheme(scheme, group)
        prefix = "model.layers.0.self_attn.q_proj."
        stored = {k[len(prefix):]: v for k, v in out.items() if k.startswith(prefix)}
        assert np.array_equal(decoded[prefix + "weight"], ct.dequantize(stored, s).numpy())


def test_cli_compare_finds_mismatches():
    with tempfile.TemporaryDirectory() as d:
        src = _float_model(os.path.join(d, "in"))
        out = _lineage_like(src, os.path.join(d, "out"), "W4A16", "32")
        base = ["compare", "--input", os.path.join(d, "in"), "--output", os.path.join(d, "out"), "--scheme", "W4A16"]
        r = _cli(*base, "--group", "64")                   # other group size: scales and config differ
        assert r.returncode == 1 and "MISMATCH" in r.stderr
        # One flipped nibble in a packed word.
        bad = dict(out)
        words = bad["model.layers.0.self_attn.k_proj.weight_packed"].clone()
        words[3, 1] ^= 0x10
        bad["model.layers.0.self_attn.k_proj.weight_packed"] = words
        write_safetensors(os.path.join(d, "out", "model.safetensors"), bad, {"format": "pt"})
        r = _cli(*base, "--group", "32")
        assert r.returncode == 1
        assert "'model.layers.0.self_attn.k_proj.weight_packed' (quantized): 1 of" in r.stderr and "[3, 1]" in r.stderr
        # A copied tensor changed.
        bad = dict(out)
        bad["model.norm.weight"] = out["model.norm.weight"].clone()
        bad["model.norm.weight"][0] += 1
        write_safetensors(os.path.join(d, "out", "model.safetensors"), bad, {"format": "pt"})
        r = _cli(*base, "--group", "32")
        assert r.returncode == 1 and "'model.norm.weight' (copied)" in r.stderr


def test_quant_goldens_resolve(tmp_path):
    """One quant golden case written and read back: the decode CLI gives the golden's weights."""
    import quant_goldens
    case = next(c for c in quant_goldens.CASES if c.name == "mixed")
    summary = quant_goldens.build_case(case, str(tmp_path / "mixed"))
    assert "mixed-precision" in summary
    with open(tmp_path / "mixed" / "config.json") as f:
        config = json.load(f)
    from safetensors_io import read_checkpoint
    stored = read_checkpoint(str(tmp_path / "mixed"))
    kinds = {s.kind for s in ct.quantized_modules(config, stored).values()}
    assert kinds == {"int", "fp8"}
    assert "model.layers.0.mlp.shared_expert.gate_proj.weight" in stored          # not targeted: stays BF16
    assert isinstance(stored["model.layers.3.self_attn.o_proj.weight"], RawTensor)
