// ggml's block formats (GGUF's Q8_0 … Q6_K and MXFP4; linear.h GgmlBlock): the ref:: decoder against
// the spec's formulas (quantized-formats.md §3.2) evaluated here on hand-set blocks, every ISA table's
// decode equal to ref::'s (in the table's prepared order), every table's GEMV and rows GEMV against ref::linear (rows bit for bit
// the lone GEMV), linear() through GEMV, rows and GEMM over tokens and threads, and damaged shapes
// refused by name.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/packed_test_support.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace ggml_test {
namespace {

using namespace packed_test;

std::vector<float> ref_row(const Matrix& m, int64_t o) {
  std::vector<float> r(static_cast<size_t>(m.in));
  ref::ggml_decode_row(m.quant.ggml, m.qw.q + o * m.qw.row_bytes, m.in, r.data());
  return r;
}

// The spec's decode formulas, on blocks whose fields are set by hand.
TEST(Ggml, RefDecodesTheSpecsFormulas) {
  float y[256];
  {  // Q8_0: qs[j]·d
    uint8_t b[34] = {};
    put_half(b, 0.5f);
    b[2] = uint8_t(int8_t(-3)), b[3] = 127, b[33] = uint8_t(int8_t(-128));
    ref::ggml_decode_block(GgmlBlock::Q8_0, b, y);
    EXPECT_EQ(y[0], -1.5f);
    EXPECT_EQ(y[1], 63.5f);
    EXPECT_EQ(y[31], -64.0f);
  }
  {  // Q4_0: ((qs[j]&15) − 8)·d, ((qs[j]>>4) − 8)·d at j + 16
    uint8_t b[18] = {};
    put_half(b, 2.0f);
    b[2] = 0xf1;
    ref::ggml_decode_block(GgmlBlock::Q4_0, b, y);
    EXPECT_EQ(y[0], -14.0f);
    EXPECT_EQ(y[16], 14.0f);
  }
  {  // Q4_1: q·d + m; Q5_1 with the fifth bit from qh
    uint8_t b[24] = {};
    put_half(b, 0.25f), put_half(b + 2, -1.0f);
    b[4] = 0x3a;
    ref::ggml_decode_block(GgmlBlock::Q4_1, b, y);
    EXPECT_EQ(y[0], 10 * 0.25f - 1.0f);
    EXPECT_EQ(y[16], 3 * 0.25f - 1.0f);
    uint8_t c[24] = {};
    put_half(c, 0.25f), put_half(c + 2, -1.0f);
    c[4] = 0x01, c[7] = 0x80;  // qh bit 0 (value 0) and bit 31 (value 31)
    c[8] = 0xf2;               // qs[0]: value 0 low nibble 2, value 16 high nibble 15
    c[8 + 15] = 0x70;          // qs[15]: value 31 high nibble 7
    ref::ggml_decode_block(GgmlBlock::Q5_1, c, y);
    EXPECT_EQ(y[0], 18 * 0.25f - 1.0f);
    EXPECT_EQ(y[16], 15 * 0.25f - 1.0f);
    EXPECT_EQ(y[31], 23 * 0.25f - 1.0f);
  }
  {  // Q5_0: (q5 − 16)·d
    uint8_t b[22] = {};
    put_half(b, 1.0f);
    b[2 + 2] = 0x04;  // qh bit 18: value 18 (high nibble of qs[2]) gets 16
    b[6 + 2] = 0x30;
    ref::ggml_decode_block(GgmlBlock::Q5_0, b, y);
    EXPECT_EQ(y[2], -16.0f);
    EXPECT_EQ(y[18], 3.0f);
  }
  {  // MXFP4: kv[u]·2^(e − 128), value j the low nibble of byte j, j + 16 the high one
    uint8_t b[17] = {};
    b[0] = 130;
    b[1] = 0xd7;  // value 0: u = 7 (12), value 16: u = 13 (−6)
    ref::ggml_decode_block(GgmlBlock::MXFP4, b, y);
    EXPECT_EQ(y[0], 12.0f * 4.0f);
    EXPECT_EQ(y[16], -6.0f * 4.0f);
    b[0] = 0;  // 2^-128, a subnormal
    ref::ggml_decode_block(GgmlBlock::MXFP4, b, y);
    EXPECT_EQ(y[0], 12.0f * std::ldexp(1.0f, -128));
  }
  // Q4_K (spec: y[64c+l] = d·sc(2c)·(q[l]&15) − dmin·m(2c), y[64c+32+l] = d·sc(2c+1)·(q[l]>>4) − dmin·m(2c+1))
  // and Q6_K, on random blocks, against the formulas written out here.
  Rng rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    uint8_t b[210];
    for (uint8_t& v : b) v = uint8_t(rng.next_u64());
    put_half(b, 0.01171875f), put_half(b + 2, -0.0078125f);
    ref::ggml_decode_block(GgmlBlock::Q4_K, b, y);
    const uint8_t* s = b + 4;
    const auto sc = [&](int j) { return j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); };
    const auto mn = [&](int j) { return j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4); };
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = b[16 + 32 * c + l];
        ASSERT_EQ(y[64 * c + l], 0.01171875f * float(sc(2 * c)) * float(q & 15) - -0.0078125f * float(mn(2 * c)));
        ASSERT_EQ(y[64 * c + 32 + l], 0.01171875f * float(sc(2 * c + 1)) * float(q >> 4) - -0.0078125f * float(mn(2 * c + 1)));
      }
    put_half(b + 208, -0.0625f);
    ref::ggml_decode_block(GgmlBlock::Q6_K, b, y);
    for (int half = 0; half < 2; ++half)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* ql = b + 64 * half;
        const uint8_t* qh = b + 128 + 32 * half;
        const auto* scale = reinterpret_cast<const int8_t*>(b + 192 + 8 * half);
        const int q[4] = {((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32, ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32,
                          ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32, ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32};
        for (int k = 0; k < 4; ++k)
          ASSERT_EQ(y[128 * half + 32 * k + l], -0.0625f * float(scale[l / 16 + 2 * k]) * float(q[k]));
      }
  }
  {  // Q2_K: scale byte 0 = (m 3, sc 5): values 0 .. 15 from bits 0-1 of qs[0 .. 15]
    uint8_t b[84] = {};
    b[0] = 0x35;
    b[16] = 0x02;
    put_half(b + 80, 0.5f), put_half(b + 82, 0.25f);
    ref::ggml_decode_block(GgmlBlock::Q2_K, b, y);
    EXPECT_EQ(y[0], 0.5f * 5 * 2 - 0.25f * 3);
    EXPECT_EQ(y[1], -0.25f * 3);
  }
  {  // Q3_K: scale 0 = low 4 bits of byte 0, high 2 bits from byte 8; value 0 = 2-bit code − 4 unless its hmask bit
    uint8_t b[110] = {};
    b[96] = 0x07, b[96 + 8] = 0x02;  // scale 0 = 7 | 2 << 4 = 39 → 39 − 32 = 7
    b[32] = 0x03;                    // value 0: code 3
    b[0] = 0x01;                     // value 0's hmask bit set: no − 4
    put_half(b + 108, 0.5f);
    ref::ggml_decode_block(GgmlBlock::Q3_K, b, y);
    EXPECT_EQ(y[0], 0.5f * 7 * 3);
    EXPECT_EQ(y[1], 0.5f * 7 * -4);
  }
}

// Every table's decode gives ref::'s values, for every format, in the order the table's prepare puts x
// in (a column's number run through prepare says where its value lands): the same numbers, a zero's
// sign aside (Q6_K's one FMA makes +0 of what ggml's product makes −0; no sum can tell them apart but
// one of zeros only).
TEST(Ggml, EveryTableDecodesAsRef) {
  for (const GgmlBlockInfo& f : ggml_blocks()) {
    const Matrix m = random_blocks(f.block, 3, 2 * 256, 11 + f.type_id);
    std::vector<float> index(static_cast<size_t>(m.in)), where(index.size());
    for (int64_t c = 0; c < m.in; ++c) index[size_t(c)] = float(c);
    for (const GemvTable* t : tables()) {
      t->quant.prepare(m.qw, index.data(), where.data());
      for (int64_t o = 0; o < 3; ++o) {
        std::vector<float> row(static_cast<size_t>(m.in));
        t->quant.decode(m.qw, o, o + 1, row.data());
        const std::vector<float> want = ref_row(m, o);
        for (int64_t j = 0; j < m.in; ++j) {
          const auto c = size_t(where[size_t(j)]);
          ASSERT_EQ(row[size_t(j)], want[c])  // == : Q6_K's FMA gives +0 where ggml's product gives -0
              << f.name << " " << t->isa << " row " << o << " column " << c << ": " << row[size_t(j)] << " vs " << want[c];
        }
      }
    }
  }
}

// Each table's GEMV against ref::linear; its rows GEMV bit for bit the GEMV for 1 to 8 rows of x.
TEST(Ggml, EveryTableMatchesRef) {
  for (const GgmlBlockInfo& f : ggml_blocks())
    for (const GemvTable* t : tables())
      for (int64_t in : {256, 768, 4096})
        for (int64_t out : {1, 7, 33}) {
          const Matrix m = random_blocks(f.block, out, in, uint64_t(in * 3 + out + f.type_id));
          constexpr int64_t kRows = 8;
          const std::vector<float> x = random_floats(kRows * in, uint64_t(in + out));
          std::vector<float> xd(x.size());
          for (int64_t r = 0; r < kRows; ++r) t->quant.prepare(m.qw, x.data() + r * in, xd.data() + r * in);
          std::vector<float> want(size_t(kRows * out)), one(want.size()), rows(want.size());
          ref::linear(x.data(), kRows, m.view(false), nullptr, want.data());
          for (int64_t r = 0; r < kRows; ++r) t->quant.out_in(xd.data() + r * in, m.qw, 0, out, one.data() + r * out);
          ASSERT_LE(rel_rms(one, want), tolerance(in)) << worst(one, want) << "; " << f.name << " " << t->isa << " " << out << "x" << in;
          for (int64_t n = 1; n <= kRows; ++n) {
            std::fill(rows.begin(), rows.end(), 0.0f);
            t->quant.out_in_rows(xd.data(), in, n, m.qw, out / 3, out, rows.data(), out);
            for (int64_t r = 0; r < n; ++r)
              for (int64_t o = out / 3; o < out; ++o)
                ASSERT_EQ(rows[size_t(r * out + o)], one[size_t(r * out + o)]) << f.name << " " << t->isa << " rows " << n;
          }
        }
}

// linear() through each path T takes (GEMV, rows, GEMM on decoded panels), a bias and an activation,
// 1 to 3 threads: against ref::; the same bits at every thread count; 2 to 8 rows each row's lone bits.
TEST(Ggml, LinearMatchesRefOverTokensAndThreads) {
  for (const GgmlBlockInfo& f : ggml_blocks()) check_linear(random_blocks(f.block, 130, 512, 40 + f.type_id), f.name, {1, 3, 8, 9, 40});
}

TEST(Ggml, DamagedShapesAreRefusedByName) {
  Matrix m;
  m.out = 4, m.in = 512;
  m.quant.kind = StoredQuant::Kind::Ggml;
  m.quant.ggml = GgmlBlock::Q4_K;
  m.quant.origin = "x.gguf, tensor type Q4_K";
  m.data = Tensor::zeros(DType::U8, {4, 287});
  std::string e = error_of([&] { prepare_quant(m, "model.layers.1.mlp.up_proj.weight"); });
  EXPECT_NE(e.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [4, 288]"), std::string::npos) << e;
  EXPECT_NE(e.find("x.gguf"), std::string::npos) << e;
  m.in = 300;
  m.data = Tensor::zeros(DType::U8, {4, 144});
  e = error_of([&] { prepare_quant(m, "w.weight"); });
  EXPECT_NE(e.find("whole blocks of 256"), std::string::npos) << e;
  m.in = 256;
  m.data = Tensor::zeros(DType::F32, {4, 36});
  e = error_of([&] { prepare_quant(m, "w.weight"); });
  EXPECT_NE(e.find("dtype F32, expected U8"), std::string::npos) << e;
}

}  // namespace
}  // namespace ggml_test
}  // namespace lineage::kernels
