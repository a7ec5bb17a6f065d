// MXFP4 weights (matrix.h): every ISA table's kernels and linear() (GEMV, rows GEMV, GEMM) against
// the ref:: twin that dequantizes element by element in double; batch rows bit for bit their lone GEMV.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"
#include "lineage/kernels/x86/gemm.h"
#include "lineage/kernels/packed_test_support.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace mxfp4_test {
namespace {

using namespace packed_test;

// Random codes (every nibble equally likely) and exponents in [lo, hi], [out, in] as MXFP4.
Matrix random_mxfp4(int64_t out, int64_t in, uint64_t seed, int lo = 120, int hi = 130) {
  Matrix m;
  m.out = out, m.in = in, m.packed = true;
  m.data = Tensor::empty(DType::U8, {out, in / 2});
  m.scales = Tensor::empty(DType::U8, {out, in / 32});
  Rng rng(seed);
  for (int64_t i = 0; i < m.data.numel(); ++i) m.data.data<uint8_t>()[i] = uint8_t(rng.next_u64());
  for (int64_t i = 0; i < m.scales.numel(); ++i) m.scales.data<uint8_t>()[i] = uint8_t(lo + rng.next_u64() % (hi - lo + 1));
  return m;
}

Tensor random_bias(int64_t n, uint64_t seed) {
  Tensor b = Tensor::empty(DType::F32, {n});
  const std::vector<float> v = random_floats(n, seed);
  std::memcpy(b.data<float>(), v.data(), v.size() * sizeof(float));
  return b;
}


// The format as the brief and the OCP spec define it, value by value.
TEST(Mxfp4, RefDecodesTheFormat) {
  Matrix m = random_mxfp4(2, 64, 1);
  uint8_t* q = m.data.data<uint8_t>();
  uint8_t* s = m.scales.data<uint8_t>();
  q[0] = 0x21;  // column 0: code 1 (0.5), column 1: code 2 (1.0)
  q[1] = 0xf7;  // column 2: 6, column 3: -6
  q[2] = 0x98;  // column 4: -0, column 5: -0.5
  s[0] = 127, s[1] = 130, s[2] = 100, s[3] = 0;
  q[16] = 0x53;  // row 0, column 32: 1.5 · 2^3, column 33: 3 · 2^3
  q[32] = 0x07, q[48] = 0x01;  // row 1, column 0: 6 · 2^-27; column 32: 0.5 · 2^-127 (a subnormal f32)
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 0), 0.5);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 1), 1.0);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 2), 6.0);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 3), -6.0);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 4), 0.0);
  EXPECT_TRUE(std::signbit(ref::mxfp4_element(m.data, m.scales, 0, 4)));
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 5), -0.5);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 32), 12.0);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 0, 33), 24.0);
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 1, 0), 6.0 * std::ldexp(1.0, -27));
  EXPECT_EQ(ref::mxfp4_element(m.data, m.scales, 1, 32), std::ldexp(1.0, -128));
  // Every table's decode gives exactly these values (in its prepared order: the prepared x of a
  // one-hot column c picks element c out of the decoded row).
  for (const GemvTable* t : tables())
    for (int64_t o = 0; o < 2; ++o) {
      const auto ld = static_cast<size_t>(t->mxfp4.stride(64));
      std::vector<float> row(ld), x(64), xd(ld);
      t->mxfp4.decode(m.data.data<uint8_t>(), m.scales.data<uint8_t>(), 64, o, o + 1, row.data());
      for (int64_t c = 0; c < 64; ++c) {
        std::fill(x.begin(), x.end(), 0.0f);
        x[size_t(c)] = 1.0f;
        t->mxfp4.prepare(x.data(), 64, xd.data());
        float got = 0.0f;
        for (size_t j = 0; j < ld; ++j) got += xd[j] * row[j];
        ASSERT_EQ(double(got), ref::mxfp4_element(m.data, m.scales, o, c)) << t->isa << " row " << o << " column " << c;
      }
    }
}

TEST(Mxfp4, NanScaleIsFoundAndPropagates) {
  Matrix m = random_mxfp4(3, 96, 2);
  EXPECT_EQ(first_nan_scale(m), -1);
  m.scales.data<uint8_t>()[7] = 255;  // row 2, block 1
  m.scales.data<uint8_t>()[8] = 255;
  EXPECT_EQ(first_nan_scale(m), 7);
  Matrix f;
  f.data = Tensor::zeros(DType::F32, {3, 96});
  f.out = 3, f.in = 96;
  EXPECT_EQ(first_nan_scale(f), -1);
  EXPECT_EQ(m.format(), MatrixFormat::MXFP4);
  EXPECT_EQ(m.view(false).in(), 96);
  EXPECT_EQ(m.view(false).out(), 3);
  const std::vector<float> x = random_floats(96, 3);
  std::vector<float> y(3);
  linear(x.data(), 1, m, nullptr, y.data());
  EXPECT_FALSE(std::isnan(y[0]));
  EXPECT_FALSE(std::isnan(y[1]));
  EXPECT_TRUE(std::isnan(y[2]));
}

// Exponents 0 (2^-127, a subnormal factor) and 255 (NaN) inside whole 128-column lines, where the
// AVX-512 GEMV takes its rare-exponent fix: every table and linear()'s GEMM give the ref's values, to
// 1e-6 relative plus what rounding to the subnormal grid (2^-149) can cost each of the `in` products.
TEST(Mxfp4, ExtremeExponentsMatchRef) {
  constexpr int64_t in = 512, out = 3;
  Matrix m = random_mxfp4(out, in, 31);
  uint8_t* s = m.scales.data<uint8_t>();
  for (int64_t b = 0; b < in / 32; ++b) {
    s[b] = 0;                           // row 0: every factor subnormal
    s[in / 32 + b] = b % 3 ? 1 : 0;     // row 1: the smallest normal beside the subnormal
    s[2 * in / 32 + b] = b == 5 ? 255 : 127;  // row 2: a NaN in the second line
  }
  const std::vector<float> x = random_floats(9 * in, 32);
  std::vector<float> want(9 * out), got(9 * out);
  ref::linear(x.data(), 9, m.view(false), nullptr, want.data());
  const auto near = [&](float v) { return 1e-6 * std::fabs(v) + double(in) * std::ldexp(1.0, -149); };
  for (const GemvTable* t : tables()) {
    std::vector<float> xd(static_cast<size_t>(t->mxfp4.stride(in)));
    t->mxfp4.prepare(x.data(), in, xd.data());
    t->mxfp4.out_in(xd.data(), m.data.data<uint8_t>(), s, in, 0, out, got.data());
    for (int64_t o = 0; o < 2; ++o)
      EXPECT_NEAR(got[o], want[o], near(want[o])) << t->isa << " row " << o;
    EXPECT_TRUE(std::isnan(got[2])) << t->isa;
  }
  linear(x.data(), 9, m, nullptr, got.data());  // the GEMM (T > 8)
  for (int64_t t = 0; t < 9; ++t) {
    for (int64_t o = 0; o < 2; ++o)
      EXPECT_NEAR(got[t * out + o], want[t * out + o], near(want[t * out + o])) << "T 9 row " << t;
    EXPECT_TRUE(std::isnan(got[t * out + 2])) << "T 9 row " << t;
  }
  EXPECT_EQ(first_nan_scale(m), 2 * in / 32 + 5);
}

// Each table's GEMV and rows GEMV called directly, over inputs of 1 to 128 blocks, rows that end
// inside every tile, 1 to 8 rows of x: against ref::, and the rows GEMV bit for bit the GEMV's.
TEST(Mxfp4, EveryTableMatchesRef) {
  for (const GemvTable* t : tables())
    for (int64_t in : {32, 64, 96, 4096})
      for (int64_t out : {1, 5, 17, 33}) {
        const Matrix m = random_mxfp4(out, in, uint64_t(in * 7 + out));
        const Weight W = m.view(false);
        const auto* q = m.data.data<uint8_t>();
        const auto* s = m.scales.data<uint8_t>();
        constexpr int64_t kRows = 8;
        const std::vector<float> x = random_floats(kRows * in, uint64_t(in + out));
        const int64_t ld = t->mxfp4.stride(in);
        std::vector<float> xd(static_cast<size_t>(kRows * ld));
        for (int64_t r = 0; r < kRows; ++r) t->mxfp4.prepare(x.data() + r * in, in, xd.data() + r * ld);
        std::vector<float> want(static_cast<size_t>(kRows * out)), one(static_cast<size_t>(kRows * out)), rows(static_cast<size_t>(kRows * out));
        ref::linear(x.data(), kRows, W, nullptr, want.data());
        for (int64_t r = 0; r < kRows; ++r) t->mxfp4.out_in(xd.data() + r * ld, q, s, in, 0, out, one.data() + r * out);
        ASSERT_LE(rel_rms(one, want), tolerance(in)) << worst(one, want) << "; " << t->isa << " " << out << "x" << in;
        for (int64_t n = 1; n <= kRows; ++n) {
          std::fill(rows.begin(), rows.end(), 0.0f);
          const int64_t o0 = out / 3;  // a sub-range, as a thread's chunk
          t->mxfp4.out_in_rows(xd.data(), ld, n, q, s, in, o0, out, rows.data(), out);
          for (int64_t r = 0; r < n; ++r)
            for (int64_t o = o0; o < out; ++o)
              ASSERT_EQ(rows[size_t(r * out + o)], one[size_t(r * out + o)])
                  << t->isa << " " << out << "x" << in << " rows " << n << " row " << r << " output " << o;
        }
      }
}

// linear() on MXFP4 matrices through whichever path each T takes (GEMV, rows GEMV, GEMM), with a
// bias and an activation, 1 to 3 threads: against ref:: then activate(). The GEMM path's result does
// not depend on the thread count; the GEMVs' not either (fixed rows per output).
TEST(Mxfp4, LinearMatchesRefOverShapesTokensThreads) {
  const std::string gemm = gemm_table().mxfp4 ? "own AVX-512 GEMM" : "decoded panels + OpenBLAS";
  RecordProperty("mxfp4_gemm", gemm);
  std::printf("MXFP4: table %s, T > 8 on the %s\n", gemv_table().isa, gemm.c_str());
  double worst_err = 0, worst_gemv = 0;
  for (auto [in, out] : {std::array<int64_t, 2>{32, 7}, {64, 50}, {96, 130}, {4096, 67}, {384, 256}, {256, 384}, {768, 384}, {384, 768}})
    for (int64_t T : {1, 2, 3, 8, 9, 17, 64, 300}) {
      const Matrix m = random_mxfp4(out, in, uint64_t(in + 3 * out));
      const Tensor bias = random_bias(out, uint64_t(out));
      const std::vector<float> x = random_floats(T * in, uint64_t(T * 5 + in));
      std::vector<float> want(static_cast<size_t>(T * out)), got(static_cast<size_t>(T * out)), first;
      ref::linear(x.data(), T, m.view(false), &bias, want.data());
      activate(Activation::Silu, want.data(), T * out);
      for (int threads : {1, 2, 3}) {
        set_threads(threads);
        linear(x.data(), T, m, &bias, got.data(), Activation::Silu);
        const double err = rel_rms(got, want);
        worst_err = std::max(worst_err, err);
        if (T <= 8) worst_gemv = std::max(worst_gemv, err);
        ASSERT_LE(err, tolerance(in)) << worst(got, want) << "; " << out << "x" << in << " T " << T << " threads " << threads;
        if (threads == 1) {
          first = got;
        } else if (gemm_table().mxfp4 || T <= 8) {
          ASSERT_EQ(got, first) << out << "x" << in << " T " << T << " threads " << threads;
        }
      }
    }
  set_threads(0);
  std::printf("MXFP4 linear: worst relative RMS error against ref %.3g (GEMVs, T <= 8: %.3g)\n", worst_err,
              worst_gemv);
}

// 2 to 8 tokens (a batch of decode steps): each row bit for bit what it gets alone, 1 to 3 threads,
// with a bias and an activation, at K3's expert shape and at awkward ones.
TEST(Mxfp4, FewRowsAreEachRowAloneBitForBit) {
  for (int threads : {1, 2, 3}) {
    set_threads(threads);
    for (auto [in, out] : {std::array<int64_t, 2>{3584, 300}, {96, 77}, {32, 3}}) {
      const Matrix m = random_mxfp4(out, in, uint64_t(in * out));
      const Tensor bias = random_bias(out, 5);
      for (int64_t T = 2; T <= 8; ++T) {
        const std::vector<float> x = random_floats(T * in, uint64_t(T + in));
        std::vector<float> all(static_cast<size_t>(T * out)), one(static_cast<size_t>(out));
        linear(x.data(), T, m, &bias, all.data(), Activation::GeluTanh);
        for (int64_t t = 0; t < T; ++t) {
          linear(x.data() + t * in, 1, m, &bias, one.data(), Activation::GeluTanh);
          ASSERT_EQ(std::vector<float>(all.begin() + t * out, all.begin() + (t + 1) * out), one)
              << out << "x" << in << " T " << T << " row " << t << " threads " << threads;
        }
      }
    }
  }
  set_threads(0);
}

// MXFP4 members of a group (K3's routed expert gate and up projections) beside a BF16 one: each
// output what linear() gives it alone, for one token (one shared region) and for several, exact and
// in the bf16 dot mode.
TEST(Mxfp4, GroupEqualsOneCallEach) {
  constexpr int64_t in = 512;
  const Matrix gate = random_mxfp4(700, in, 11), up = random_mxfp4(300, in, 12);
  Matrix dense;
  dense.data = Tensor::empty(DType::BF16, {90, in});
  dense.out = 90, dense.in = in;
  const std::vector<float> dv = random_floats(90 * in, 13);
  for (int64_t i = 0; i < 90 * in; ++i) dense.data.data<uint16_t>()[i] = f32_to_bf16(dv[size_t(i)]);
  const Tensor bias = random_bias(300, 14);
  for (int threads : {1, 2, 3})
    for (bool dot : {false, true}) {  // exact products, and the bf16 dot mode where it runs
      set_threads(threads);
      for (int64_t T : {1, 4, 12}) {
        const std::vector<float> x = random_floats(T * in, uint64_t(T));
        std::vector<float> yg(static_cast<size_t>(T * 700)), yu(static_cast<size_t>(T * 300)), yd(static_cast<size_t>(T * 90));
        std::vector<float> wg(yg.size()), wu(yu.size()), wd(yd.size());
        const LinearOut outs[] = {{gate.view(dot), nullptr, yg.data(), Activation::Silu},
                                  {dense.view(dot), nullptr, yd.data()},
                                  {up.view(dot), &bias, yu.data()}};
        linear_group(x.data(), T, outs);
        linear(x.data(), T, gate, nullptr, wg.data(), Activation::Silu, dot);
        linear(x.data(), T, dense, nullptr, wd.data(), std::nullopt, dot);
        linear(x.data(), T, up, &bias, wu.data(), std::nullopt, dot);
        EXPECT_EQ(yg, wg) << "T " << T << " threads " << threads << " dot " << dot;
        EXPECT_EQ(yd, wd) << "T " << T << " threads " << threads << " dot " << dot;
        EXPECT_EQ(yu, wu) << "T " << T << " threads " << threads << " dot " << dot;
      }
    }
  set_threads(0);
}

// The bf16 dot mode (Weight::bf16_dot where the CPU has AVX512_BF16) through every path linear()
// takes (GEMV, rows GEMV, GEMM over rounded x), with a bias and an activation, 1 and 2 threads:
// against ref::linear of the same mode (x rounded to bf16, products in double) to the f32 sums'
// tolerance; against the exact products (x unrounded) an error of bf16's rounding of x (2^-7 over
// √12 of a spread of octaves, ~1.6e-3 relative RMS: between 1e-4 and 2.5e-3, as the BF16 weights'
// mode is held in linear_test); each row of 2-8 bit for bit its lone GEMV; exponents 0 and 255 as the
// exact kernels take them (the subnormal factor, the NaN).
TEST(Mxfp4, Bf16DotMatchesItsRefAndItsLoneRows) {
  if (!bf16_dot_available()) GTEST_SKIP() << "CPU lacks AVX512_BF16 (or LINEAGE_ISA forced a lower ISA)";
  for (auto [in, out] : {std::array<int64_t, 2>{32, 7}, {96, 130}, {128, 33}, {384, 256}, {3584, 70}})
    for (int64_t T : {1, 2, 5, 8, 9, 40}) {
      const Matrix m = random_mxfp4(out, in, uint64_t(in + 5 * out));
      const Tensor bias = random_bias(out, uint64_t(out + 1));
      const std::vector<float> x = random_floats(T * in, uint64_t(T * 3 + in));
      std::vector<float> want(size_t(T * out)), exact(size_t(T * out)), got(size_t(T * out)), first, one(static_cast<size_t>(out));
      ASSERT_TRUE(runs_bf16_dot(m.view(true)));
      ref::linear(x.data(), T, m.view(true), &bias, want.data());
      ref::linear(x.data(), T, m.view(false), &bias, exact.data());
      for (int threads : {1, 2}) {
        set_threads(threads);
        linear(x.data(), T, m, &bias, got.data(), Activation::Silu, true);
        for (int64_t t = 0; t < T; ++t)
          if (T <= 8) {
            linear(x.data() + t * in, 1, m, &bias, one.data(), Activation::Silu, true);
            ASSERT_EQ(std::vector<float>(got.begin() + t * out, got.begin() + (t + 1) * out), one)
                << out << "x" << in << " T " << T << " row " << t << " threads " << threads;
          }
        if (threads == 1) first = got;
        else ASSERT_EQ(got, first) << out << "x" << in << " T " << T;
      }
      std::vector<float> w = want, e = exact;
      activate(Activation::Silu, w.data(), T * out);
      ASSERT_LE(rel_rms(got, w), tolerance(in)) << worst(got, w) << "; " << out << "x" << in << " T " << T;
      // Before the activation: the mode's error against the exact products.
      std::vector<float> raw(size_t(T * out));
      linear(x.data(), T, m, &bias, raw.data(), std::nullopt, true);
      const double err = rel_rms(raw, e);
      EXPECT_LE(err, 2.5e-3) << worst(raw, e) << "; " << out << "x" << in << " T " << T;
      EXPECT_GE(err, 1e-4) << "x was not rounded to bf16 (" << out << "x" << in << " T " << T << ")";
    }
  set_threads(0);
  constexpr int64_t in = 512, out = 3;
  Matrix m = random_mxfp4(out, in, 41);
  uint8_t* s = m.scales.data<uint8_t>();
  for (int64_t b = 0; b < in / 32; ++b) {
    s[b] = 0;
    s[in / 32 + b] = b % 3 ? 1 : 0;
    s[2 * in / 32 + b] = b == 5 ? 255 : 127;
  }
  const std::vector<float> x = random_floats(9 * in, 42);
  std::vector<float> want(9 * out), got(9 * out);
  ref::linear(x.data(), 9, m.view(true), nullptr, want.data());
  const auto near = [&](float v) { return 1e-6 * std::fabs(v) + double(in) * std::ldexp(1.0, -149); };
  for (int64_t T : {1, 9})
    for (int64_t t = 0; t < T; ++t) {
      linear(x.data(), T, m, nullptr, got.data(), std::nullopt, true);
      for (int64_t o = 0; o < 2; ++o)
        EXPECT_NEAR(got[t * out + o], want[t * out + o], near(want[t * out + o])) << "T " << T << " row " << t;
      EXPECT_TRUE(std::isnan(got[t * out + 2])) << "T " << T << " row " << t;
    }
}

// The GEMM at K3's expert shape (slices of the reduction, many column blocks) against ref::, and a
// token of it against the lone GEMV: the same products summed in another order (~1e-7).
TEST(Mxfp4, GemmAtExpertShapeMatchesRefAndGemv) {
  constexpr int64_t in = 3584, out = 200, T = 24;
  const Matrix m = random_mxfp4(out, in, 21);
  const std::vector<float> x = random_floats(T * in, 22);
  std::vector<float> got(static_cast<size_t>(T * out)), want(static_cast<size_t>(T * out)), one(static_cast<size_t>(out));
  ref::linear(x.data(), T, m.view(false), nullptr, want.data());
  linear(x.data(), T, m, nullptr, got.data());
  EXPECT_LE(rel_rms(got, want), tolerance(in)) << worst(got, want);
  linear(x.data() + 5 * in, 1, m, nullptr, one.data());
  const std::vector<float> row(got.begin() + 5 * out, got.begin() + 6 * out);
  EXPECT_LE(rel_rms(one, row), tolerance(in)) << worst(one, row);
}

}  // namespace
}  // namespace mxfp4_test
}  // namespace lineage::kernels
