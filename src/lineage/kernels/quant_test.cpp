// Quantized matrices (compressed-tensors int4 / int8 pack-quantized, FP8 per channel and in blocks,
// transformers' fp8, NVFP4): prepare_quant on stored tensors, every ISA table's kernels and linear()
// (GEMV, rows GEMV, GEMM) against the ref:: twin that decodes element by element; batch rows bit for
// bit their lone GEMV; damaged scales and shapes refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"
#include "lineage/kernels/packed_test_support.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace quant_test {
namespace {

using namespace packed_test;

using Kind = StoredQuant::Kind;

struct Spec {
  const char* label;
  Kind kind;
  int bits = 0;
  int64_t group = 0;  // PackedInt: 0 = channel
  bool symmetric = true;
  int64_t block = 0;  // Fp8/HfFp8: 0 channel, -1 tensor, else square blocks
  DType scale_dtype = DType::BF16;
};

const Spec kSpecs[] = {
    {"int4 g32", Kind::PackedInt, 4, 32},
    {"int4 g128 asym", Kind::PackedInt, 4, 128, false},
    {"int4 channel", Kind::PackedInt, 4, 0},
    {"int4 g16 asym f32", Kind::PackedInt, 4, 16, false, 0, DType::F32},
    {"int4 g48", Kind::PackedInt, 4, 48},
    {"int8 g32", Kind::PackedInt, 8, 32},
    {"int8 channel asym f16", Kind::PackedInt, 8, 0, false, 0, DType::F16},
    {"fp8 block 128", Kind::Fp8, 0, 0, true, 128},
    {"fp8 channel", Kind::Fp8, 0, 0, true, 0, DType::F32},
    {"fp8 tensor", Kind::Fp8, 0, 0, true, -1},
    {"hf fp8 block 32", Kind::HfFp8, 0, 0, true, 32},
    {"nvfp4", Kind::Nvfp4},
};

bool fits(const Spec& s, int64_t in) {
  const int64_t whole = (s.kind == Kind::PackedInt && s.bits == 4) || s.kind == Kind::Nvfp4 ? 32 : 16;
  return in % whole == 0 && (s.kind != Kind::PackedInt || !s.group || s.group <= in);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void put_scale(Tensor& t, int64_t i, float v) {
  if (t.dtype() == DType::F32) t.data<float>()[i] = v;
  else if (t.dtype() == DType::F16) t.data<uint16_t>()[i] = f32_to_f16(v);
  else t.data<uint16_t>()[i] = f32_to_bf16(v);
}

// A random non-NaN E4M3 byte whose exponent field lies in [lo, hi].
uint8_t random_e4m3(Rng& rng, int lo, int hi) {
  const uint64_t r = rng.next_u64();
  const int e = lo + int(r % uint64_t(hi - lo + 1));
  uint8_t b = uint8_t((r >> 8 & 0x80) | (e << 3) | (r >> 16 & 7));
  if ((b & 0x7f) == 0x7f) b &= 0xfe;
  return b;
}

// Random stored tensors of the layout `s` (every code equally likely; scales near 2^-4), prepared.
Matrix random_quant(const Spec& s, int64_t out, int64_t in, uint64_t seed) {
  Matrix m;
  m.out = out, m.in = in;
  m.quant.kind = s.kind, m.quant.bits = s.bits, m.quant.group = s.group, m.quant.symmetric = s.symmetric;
  m.quant.block_rows = m.quant.block_cols = s.block;
  m.quant.origin = s.label;
  Rng rng(seed);
  const auto fill_bytes = [&](Tensor& t) {
    auto* b = static_cast<uint8_t*>(t.raw_mut());
    for (size_t i = 0; i < t.nbytes(); ++i) b[i] = uint8_t(rng.next_u64());
  };
  const auto scale = [&]() { return std::ldexp(1.0f + float(rng.next_u64() % 128) / 128.0f, -4 - int(rng.next_u64() % 3)); };
  switch (s.kind) {
    case Kind::PackedInt: {
      const int64_t groups = s.group ? ceil_div(in, s.group) : 1;
      m.data = Tensor::empty(DType::I32, {out, in * s.bits / 32});
      fill_bytes(m.data);
      m.scales = Tensor::empty(s.scale_dtype, {out, groups});
      for (int64_t i = 0; i < m.scales.numel(); ++i) put_scale(m.scales, i, scale());
      if (!s.symmetric) {
        m.zero_point = Tensor::empty(DType::I32, {ceil_div(out * s.bits, 32), groups});
        fill_bytes(m.zero_point);
      }
      m.weight_shape = Tensor::empty(DType::I64, {2});
      m.weight_shape.data<int64_t>()[0] = out, m.weight_shape.data<int64_t>()[1] = in;
      break;
    }
    case Kind::Fp8:
    case Kind::HfFp8: {
      m.data = Tensor::empty(DType::F8_E4M3, {out, in});
      for (int64_t i = 0; i < m.data.numel(); ++i) m.data.data<uint8_t>()[i] = random_e4m3(rng, 0, 15);
      const Shape shape = s.block < 0 ? Shape{1} : s.block == 0 ? Shape{out, 1} : Shape{ceil_div(out, s.block), ceil_div(in, s.block)};
      m.scales = Tensor::empty(s.scale_dtype, shape);
      for (int64_t i = 0; i < m.scales.numel(); ++i) put_scale(m.scales, i, scale());
      break;
    }
    case Kind::Nvfp4: {
      m.data = Tensor::empty(DType::U8, {out, in / 2});
      fill_bytes(m.data);
      m.scales = Tensor::empty(DType::F8_E4M3, {out, in / 16});
      for (int64_t i = 0; i < m.scales.numel(); ++i) m.scales.data<uint8_t>()[i] = random_e4m3(rng, 4, 10);
      m.global_scale = Tensor::empty(DType::F32, {1});
      m.global_scale.data<float>()[0] = 2688.0f / 3.7f;
      break;
    }
    case Kind::Ggml:  // ggml_test.cpp
    case Kind::None: break;
  }
  prepare_quant(m, "model.layers.0.mlp.down_proj.weight");
  return m;
}


// The formats as the spec defines them, value by value, through ref:: and every table's decode.
TEST(Quant, RefAndEveryTableDecodeTheFormats) {
  {  // int4 g32 with zero points: (u - 8 - z) · s
    Matrix m = random_quant({"int4", Kind::PackedInt, 4, 32, false}, 8, 64, 1);
    auto* w = m.data.data<int32_t>();
    w[0] = int32_t(0x000000f1u);  // columns 0, 1: nibbles 1, 15
    put_scale(m.scales, 0, 0.5f);
    m.zero_point.data<int32_t>()[0] = int32_t((m.zero_point.data<uint32_t>()[0] & ~15u) | 10u);  // row 0, group 0: z = 2
    prepare_quant(m, "w.weight");
    EXPECT_EQ(ref::quant_element(m.qw, 0, 0), (1 - 8 - 2) * 0.5f);
    EXPECT_EQ(ref::quant_element(m.qw, 0, 1), (15 - 8 - 2) * 0.5f);
  }
  {  // int8 channel: u - 128
    Matrix m = random_quant({"int8", Kind::PackedInt, 8, 0}, 2, 16, 2);
    m.data.data<uint32_t>()[0] = 0x00ff0180u;  // columns 0..3: 128, 1, 255, 0
    put_scale(m.scales, 0, 0.25f);
    prepare_quant(m, "w.weight");
    EXPECT_EQ(ref::quant_element(m.qw, 0, 0), 0.0f);
    EXPECT_EQ(ref::quant_element(m.qw, 0, 1), -127 * 0.25f);
    EXPECT_EQ(ref::quant_element(m.qw, 0, 2), 127 * 0.25f);
    EXPECT_EQ(ref::quant_element(m.qw, 0, 3), -128 * 0.25f);
  }
  {  // FP8: 448, the smallest subnormal, -1.5, NaN
    Matrix m = random_quant({"fp8", Kind::Fp8, 0, 0, true, 0, DType::F32}, 2, 16, 3);
    uint8_t* b = m.data.data<uint8_t>();
    b[0] = 0x7e, b[1] = 0x01, b[2] = 0xbc, b[3] = 0xff;
    m.scales.data<float>()[0] = 2.0f;
    prepare_quant(m, "w.weight");
    EXPECT_EQ(ref::quant_element(m.qw, 0, 0), 896.0f);
    EXPECT_EQ(ref::quant_element(m.qw, 0, 1), std::ldexp(1.0f, -8));
    EXPECT_EQ(ref::quant_element(m.qw, 0, 2), -3.0f);
    EXPECT_TRUE(std::isnan(ref::quant_element(m.qw, 0, 3)));
    b[3] = 0x00;
    prepare_quant(m, "w.weight");
  }
  {  // NVFP4: e2m1 · (scale / global)
    Matrix m = random_quant({"nvfp4", Kind::Nvfp4}, 2, 32, 4);
    m.data.data<uint8_t>()[0] = 0xf7;              // columns 0, 1: 6, -6
    m.scales.data<uint8_t>()[0] = 0x40;            // 2.0
    m.global_scale.data<float>()[0] = 3.0f;
    prepare_quant(m, "w.weight");
    EXPECT_EQ(ref::quant_element(m.qw, 0, 0), 6.0f * (2.0f / 3.0f));
    EXPECT_EQ(ref::quant_element(m.qw, 0, 1), -6.0f * (2.0f / 3.0f));
  }
  // Every table's decode gives ref's values exactly (in prepared order: the prepared x of a one-hot
  // column c picks element c out of the decoded row).
  for (const Spec& s : kSpecs) {
    constexpr int64_t out = 3, in = 160;
    if (!fits(s, in)) continue;
    const Matrix m = random_quant(s, out, in, 5);
    for (const GemvTable* t : tables())
      for (int64_t o = 0; o < out; ++o) {
        std::vector<float> row(in), x(in), xd(in);
        t->quant.decode(m.qw, o, o + 1, row.data());
        for (int64_t c = 0; c < in; ++c) {
          std::fill(x.begin(), x.end(), 0.0f);
          x[size_t(c)] = 1.0f;
          t->quant.prepare(m.qw, x.data(), xd.data());
          float got = 0.0f;
          for (int64_t j = 0; j < in; ++j) got += xd[size_t(j)] * row[size_t(j)];
          ASSERT_EQ(got, ref::quant_element(m.qw, o, c)) << s.label << " " << t->isa << " row " << o << " column " << c;
        }
      }
  }
}

// Each table's GEMV and rows GEMV called directly over shapes whose rows end inside groups and runs:
// against ref::, and the rows GEMV bit for bit the GEMV's for 1 to 8 rows of x.
TEST(Quant, EveryTableMatchesRef) {
  for (const Spec& s : kSpecs)
    for (const GemvTable* t : tables())
      for (int64_t in : {32, 96, 160, 4096})
        for (int64_t out : {1, 5, 33}) {
          if (!fits(s, in)) continue;
          const Matrix m = random_quant(s, out, in, uint64_t(in * 7 + out));
          constexpr int64_t kRows = 8;
          const std::vector<float> x = random_floats(kRows * in, uint64_t(in + out));
          std::vector<float> xd(size_t(kRows * in));
          for (int64_t r = 0; r < kRows; ++r) t->quant.prepare(m.qw, x.data() + r * in, xd.data() + r * in);
          std::vector<float> want(size_t(kRows * out)), one(want.size()), rows(want.size());
          ref::linear(x.data(), kRows, m.view(false), nullptr, want.data());
          for (int64_t r = 0; r < kRows; ++r) t->quant.out_in(xd.data() + r * in, m.qw, 0, out, one.data() + r * out);
          ASSERT_LE(rel_rms(one, want), tolerance(in)) << worst(one, want) << "; " << s.label << " " << t->isa << " " << out << "x" << in;
          for (int64_t n = 1; n <= kRows; ++n) {
            std::fill(rows.begin(), rows.end(), 0.0f);
            const int64_t o0 = out / 3;
            t->quant.out_in_rows(xd.data(), in, n, m.qw, o0, out, rows.data(), out);
            for (int64_t r = 0; r < n; ++r)
              for (int64_t o = o0; o < out; ++o)
                ASSERT_EQ(rows[size_t(r * out + o)], one[size_t(r * out + o)])
                    << s.label << " " << t->isa << " " << out << "x" << in << " rows " << n << " row " << r;
          }
        }
}

// linear() through whichever path each T takes, with a bias and an activation, 1 to 3 threads:
// against ref:: then activate(); the same bits at every thread count; 2 to 8 rows each row's lone bits.
TEST(Quant, LinearMatchesRefOverShapesTokensThreads) {
  for (const Spec& s : kSpecs)
    for (auto [in, out] : {std::array<int64_t, 2>{64, 50}, {160, 130}, {512, 300}}) {
      if (!fits(s, in)) continue;
      check_linear(random_quant(s, out, in, uint64_t(in + 3 * out)), s.label, {1, 2, 5, 8, 9, 40});
    }
}

// The int8-activation mode (linear.h): against ref::'s definition of it, through every path T takes
// (lone, rows, the tiled GEMM beyond 8 rows), each row of y the lone GEMV's bits at every thread count
// and T;
// a matrix whose groups are no whole lines (int4 g32, int8 g32) runs the exact path. The mode is seen
// to be on: its results differ from the exact path's.
TEST(Quant, Int8DotMatchesRefAndItsLoneRows) {
  if (!int8_dot_available()) GTEST_SKIP() << "no AVX512_VNNI here (or LINEAGE_ISA narrows the kernels)";
  const Spec int8_g64{"int8 g64", Kind::PackedInt, 8, 64};
  for (const Spec& s : {kSpecs[1], kSpecs[2], kSpecs[6], int8_g64, kSpecs[0], kSpecs[5]})
    for (auto [in, out] : {std::array<int64_t, 2>{128, 5}, {256, 33}, {2304, 70}}) {
      Matrix m = random_quant(s, out, in, uint64_t(in + 5 * out));
      const Matrix exact = m;
      m.qw.int8_dot = true;
      const bool on = runs_int8_dot(m.qw);
      EXPECT_EQ(on, s.group != 32) << s.label;
      for (int64_t T : {1, 3, 8, 9, 70}) {
        std::vector<float> x = random_floats(T * in, uint64_t(T + in));
        x[0] = 0.0f;  // a block with a zero, one below with every x equal
        for (int64_t c = 32; c < 64; ++c) x[size_t(c)] = 0.25f;
        std::vector<float> want(size_t(T * out)), got(want.size()), plain(want.size()), first, one(static_cast<size_t>(out));
        ref::linear(x.data(), T, m.view(false), nullptr, want.data());
        for (int threads : {1, 2}) {
          set_threads(threads);
          linear(x.data(), T, m, nullptr, got.data());
          ASSERT_LE(rel_rms(got, want), tolerance(in)) << worst(got, want) << "; " << s.label << " " << out << "x" << in << " T " << T;
          if (threads == 1) first = got;
          else ASSERT_EQ(got, first) << s.label << " T " << T;
          if (!on && T > 8) continue;  // the exact path's GEMM
          for (int64_t t = 0; t < T; ++t) {
            linear(x.data() + t * in, 1, m, nullptr, one.data());
            ASSERT_EQ(std::vector<float>(got.begin() + t * out, got.begin() + (t + 1) * out), one)
                << s.label << " " << out << "x" << in << " T " << T << " row " << t;
          }
        }
        linear(x.data(), T, exact, nullptr, plain.data());
        if (!on) {
          EXPECT_EQ(got, plain) << s.label;
          continue;
        }
        EXPECT_GT(rel_rms(got, plain), 1e-4) << s.label;
        // No further from the exact products than x's rounding allows: |Δy| <= Σ_c |W[o, c]| · d_b / 2
        // (d_b the scale of column c's block), plus f32 rounding.
        std::vector<int8_t> xq(static_cast<size_t>(in));
        std::vector<float> d(static_cast<size_t>(in / 32));
        for (int64_t t = 0; t < T; ++t) {
          ref::quantize_x_int8(x.data() + t * in, in, xq.data(), d.data());
          for (int64_t o = 0; o < out; ++o) {
            double bound = 0, mass = 0;
            for (int64_t c = 0; c < in; ++c) {
              const double w = std::fabs(ref::quant_element(m.qw, o, c));
              bound += w * d[size_t(c / 32)] / 2;
              mass += w * std::fabs(x[size_t(t * in + c)]);
            }
            ASSERT_LE(std::fabs(double(got[size_t(t * out + o)]) - plain[size_t(t * out + o)]), bound + 1e-5 * mass)
                << s.label << " " << out << "x" << in << " T " << T << " row " << t << " output " << o;
          }
        }
      }
    }
  set_threads(0);
}

// ref::quantize_x_int8: the block's largest |x| becomes ±127, zeros stay zero, a NaN poisons its block.
TEST(Quant, Int8ActivationCodes) {
  std::vector<float> x(64, 0.0f);
  x[3] = -2.0f, x[4] = 1.0f, x[5] = 0.0079f;
  x[40] = std::nanf("");
  std::vector<int8_t> q(64);
  float d[2];
  ref::quantize_x_int8(x.data(), 64, q.data(), d);
  EXPECT_EQ(q[3], -127);
  EXPECT_EQ(q[4], 64);  // 63.5 to even
  EXPECT_EQ(q[5], 1);
  EXPECT_EQ(q[0], 0);
  EXPECT_FLOAT_EQ(d[0], 2.0f / 127.0f);
  EXPECT_TRUE(std::isnan(d[1]));
}

// A group of quantized outputs of both code widths and of every x order (int4 g32 in runs, int4 g128
// in lines on AVX-512, int8 bytes, NVFP4) for one token: each what linear() gives it alone.
TEST(Quant, GroupEqualsOneCallEach) {
  constexpr int64_t in = 256;
  const Matrix a = random_quant(kSpecs[0], 70, in, 11), b = random_quant(kSpecs[7], 40, in, 12),
               c = random_quant(kSpecs[11], 30, in, 13), d = random_quant(kSpecs[1], 20, in, 15);
  const std::vector<float> x = random_floats(in, 14);
  std::vector<float> ya(70), yb(40), yc(30), yd(20), wa(70), wb(40), wc(30), wd(20);
  const LinearOut outs[] = {{a.view(false), nullptr, ya.data()}, {b.view(false), nullptr, yb.data()},
                            {c.view(false), nullptr, yc.data()}, {d.view(false), nullptr, yd.data()}};
  linear_group(x.data(), 1, outs);
  linear(x.data(), 1, a, nullptr, wa.data());
  linear(x.data(), 1, b, nullptr, wb.data());
  linear(x.data(), 1, c, nullptr, wc.data());
  linear(x.data(), 1, d, nullptr, wd.data());
  EXPECT_EQ(ya, wa);
  EXPECT_EQ(yb, wb);
  EXPECT_EQ(yc, wc);
  EXPECT_EQ(yd, wd);
}

// Damaged stored tensors: errors naming the tensor, what was found and the config field.
TEST(Quant, DamagedTensorsAreRefusedByName) {
  Matrix m = random_quant(kSpecs[0], 4, 64, 21);
  put_scale(m.scales, 3, std::nanf(""));
  std::string e = error_of([&] { prepare_quant(m, "model.layers.2.mlp.up_proj.weight"); });
  EXPECT_NE(e.find("model.layers.2.mlp.up_proj.weight_scale"), std::string::npos) << e;
  EXPECT_NE(e.find("not finite"), std::string::npos) << e;
  EXPECT_NE(e.find("int4 g32"), std::string::npos) << e;

  m = random_quant(kSpecs[0], 4, 64, 22);
  m.weight_shape.data<int64_t>()[1] = 65;
  e = error_of([&] { prepare_quant(m, "x.weight"); });
  EXPECT_NE(e.find("x.weight_shape"), std::string::npos) << e;
  EXPECT_NE(e.find("(4, 65), expected (4, 64)"), std::string::npos) << e;

  m = random_quant(kSpecs[7], 4, 64, 23);
  m.data = Tensor::zeros(DType::BF16, {4, 64});
  e = error_of([&] { prepare_quant(m, "x.weight"); });
  EXPECT_NE(e.find("tensor \"x.weight\": dtype BF16, expected F8_E4M3"), std::string::npos) << e;

  m = random_quant(kSpecs[11], 4, 64, 24);
  m.global_scale.data<float>()[0] = 0.0f;
  e = error_of([&] { prepare_quant(m, "x.weight"); });
  EXPECT_NE(e.find("x.weight_global_scale"), std::string::npos) << e;

  m = random_quant(kSpecs[11], 4, 64, 25);
  m.scales.data<uint8_t>()[2] = 0x7f;  // E4M3 NaN
  e = error_of([&] { prepare_quant(m, "x.weight"); });
  EXPECT_NE(e.find("x.weight_scale"), std::string::npos) << e;

  Spec g24 = kSpecs[0];
  g24.group = 24;
  e = error_of([&] { random_quant(g24, 4, 96, 26); });
  EXPECT_NE(e.find("group_size 24"), std::string::npos) << e;
  e = error_of([&] { random_quant(kSpecs[0], 4, 48, 27); });
  EXPECT_NE(e.find("whole 32-column runs"), std::string::npos) << e;
}

}  // namespace
}  // namespace quant_test
}  // namespace lineage::kernels
