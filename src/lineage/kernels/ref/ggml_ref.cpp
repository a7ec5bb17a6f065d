// ggml's block formats decoded one block at a time, each value by the expression ggml's
// dequantize_row_* evaluates for it (spec quantized-formats.md §3.2), written out plainly: the twin the
// block kernels (x86/gemv_ggml.h) are tested against, and the loader's decoder for tensors that are no
// weight matrix (embeddings).
#include <cstdint>
#include <cstring>

#include "lineage/core/dtype.h"
#include "lineage/kernels/ref/ref.h"

namespace lineage::kernels::ref {

namespace {

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j from their 12 packed bytes.
void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// 2^(e - 128) as ggml's GGML_E8M0_TO_FP32_HALF builds it (e = 0 and 1 as subnormals).
float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

void ggml_decode_block(GgmlBlock type, const uint8_t* b, float* y) {
  switch (type) {
    case GgmlBlock::Q8_0: {
      const float d = half_at(b);
      for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
      return;
    }
    case GgmlBlock::Q4_0: {
      const float d = half_at(b);
      for (int j = 0; j < 16; ++j) {
        y[j] = float((b[2 + j] & 15) - 8) * d;
        y[j + 16] = float((b[2 + j] >> 4) - 8) * d;
      }
      return;
    }
    case GgmlBlock::Q4_1: {
      const float d = half_at(b), m = half_at(b + 2);
      for (int j = 0; j < 16; ++j) {
        y[j] = float(b[4 + j] & 15) * d + m;
        y[j + 16] = float(b[4 + j] >> 4) * d + m;
      }
      return;
    }
    case GgmlBlock::Q5_0:
    case GgmlBlock::Q5_1: {
      const bool one = type == GgmlBlock::Q5_1;
      const float d = half_at(b), m = one ? half_at(b + 2) : 0.0f;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      const uint8_t* qs = b + (one ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 15) | int(((qh >> j) & 1) << 4), hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
        if (one) {
          y[j] = float(lo) * d + m;
          y[j + 16] = float(hi) * d + m;
        } else {
          y[j] = float(lo - 16) * d;
          y[j + 16] = float(hi - 16) * d;
        }
      }
      return;
    }
    case GgmlBlock::Q2_K: {
      const uint8_t* scales = b;
      const uint8_t* q = b + 16;
      const float d = half_at(b + 80), dmin = half_at(b + 82);
      int is = 0;
      for (int half = 0; half < 2; ++half, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
          for (int part = 0; part < 2; ++part) {
            const uint8_t sc = scales[is++];
            const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * part + l] >> shift) & 3) - ml;
          }
      return;
    }
    case GgmlBlock::Q3_K: {
      const uint8_t* hm = b;
      const uint8_t* q = b + 32;
      const uint8_t* s = b + 96;
      const float d = half_at(b + 108);
      // The 16 6-bit scales: low 4 bits from bytes 0-7 (low nibbles first), high 2 bits from bytes 8-11.
      int scales[16];
      for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
        const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        scales[j] = (low | (high << 4)) - 32;
      }
      int is = 0;
      uint8_t bit = 1;
      for (int half = 0; half < 2; ++half, q += 32)
        for (int shift = 0; shift < 8; shift += 2, bit = uint8_t(bit << 1))
          for (int part = 0; part < 2; ++part) {
            const float dl = d * float(scales[is++]);
            for (int l = 0; l < 16; ++l) {
              const int i = 16 * part + l;
              *y++ = dl * float(((q[i] >> shift) & 3) - ((hm[i] & bit) ? 0 : 4));
            }
          }
      return;
    }
    case GgmlBlock::Q4_K:
    case GgmlBlock::Q5_K: {
      const bool five = type == GgmlBlock::Q5_K;
      const float d = half_at(b), dmin = half_at(b + 2);
      const uint8_t* s = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* q = b + (five ? 48 : 16);
      for (int j = 0; j < 4; ++j, q += 32) {
        int sc, m;
        scale_min_k4(2 * j, s, sc, m);
        const float d1 = d * float(sc), m1 = dmin * float(m);
        scale_min_k4(2 * j + 1, s, sc, m);
        const float d2 = d * float(sc), m2 = dmin * float(m);
        for (int l = 0; l < 32; ++l) {
          const int h = five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0;
          *y++ = d1 * float((q[l] & 15) + h) - m1;
        }
        for (int l = 0; l < 32; ++l) {
          const int h = five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
          *y++ = d2 * float((q[l] >> 4) + h) - m2;
        }
      }
      return;
    }
    case GgmlBlock::Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = half_at(b + 208);
      for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128)
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = d * float(sc[is]) * float(q1);
          y[l + 32] = d * float(sc[is + 2]) * float(q2);
          y[l + 64] = d * float(sc[is + 4]) * float(q3);
          y[l + 96] = d * float(sc[is + 6]) * float(q4);
        }
      return;
    }
    case GgmlBlock::MXFP4: {
      static constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
      const float d = e8m0_half(b[0]);
      for (int j = 0; j < 16; ++j) {
        y[j] = float(kValues[b[1 + j] & 15]) * d;
        y[j + 16] = float(kValues[b[1 + j] >> 4]) * d;
      }
      return;
    }
  }
}

void ggml_decode_row(GgmlBlock type, const uint8_t* row, int64_t n, float* y) {
  const GgmlBlockInfo& info = ggml_block_info(type);
  for (int64_t c = 0; c < n; c += info.values, row += info.bytes, y += info.values) ggml_decode_block(type, row, y);
}

}  // namespace lineage::kernels::ref
