// Fast linear (GEMV / GEMM, every ISA table this CPU has) against the scalar ref:: twin, over
// awkward sizes, all weight dtypes and layouts, 1 and 2 threads.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"
#include "lineage/kernels/x86/gemm.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace linear_test {
namespace {

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

Tensor random_tensor(Shape s, DType dt, uint64_t seed) {
  Tensor f = Tensor::empty(DType::F32, s);
  Rng rng(seed);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = rng.normal();
  return dt == DType::F32 ? f : convert(f, dt);
}

// Whether this file's dot_linear() calls let BF16 weights take bf16 dot products (Weight::bf16_dot).
bool g_dot = false;

// linear() with the test's choice of BF16 products.
void dot_linear(const float* x, int64_t T, Weight W, const Tensor* bias, float* y,
                std::optional<Activation> act = std::nullopt) {
  W.bf16_dot = g_dot;
  linear(x, T, W, bias, y, act);
}

enum class Bf16Products : uint8_t { Exact, Dot };
// Sets the BF16 products of dot_linear() for one test and restores exact ones (and the default
// thread count) on the way out, failed assertions included.
struct Bf16GemmMode {
  explicit Bf16GemmMode(Bf16Products mode) { g_dot = mode == Bf16Products::Dot; }
  ~Bf16GemmMode() {
    g_dot = false;
    set_threads(0);
  }
};

TEST(Linear, MatchesRefOverSizesDtypesLayoutsThreads) {
  Bf16GemmMode exact(Bf16Products::Exact);  // the bf16 dot path: GemmPathsMatchRefOverAwkwardSizes
  const int64_t sizes[] = {0, 1, 3, 15, 16, 17, 63, 64, 65, 130};  // inputs (0: y is the bias)
  for (int threads : {1, 2}) {
    set_threads(threads);
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
      for (Layout layout : {Layout::OutIn, Layout::InOut})
        for (int64_t in : sizes)
          for (int64_t out : {1, 17, 64, 130})
            for (int64_t T : {1, 2, 5}) {
              const Tensor w = random_tensor(layout == Layout::OutIn ? Shape{out, in} : Shape{in, out}, dt, in * 31 + out);
              const Tensor b = random_tensor({out}, dt, 7);
              const Tensor x = random_tensor({T, in}, DType::F32, T);
              std::vector<float> got(T * out), want(T * out);
              const Weight W{&w, layout};
              dot_linear(x.data<float>(), T, W, &b, got.data());
              ref::linear(x.data<float>(), T, W, &b, want.data());
              ASSERT_LE(rel_rms(got, want), 1e-5) << "dtype " << dtype_name(dt) << " layout " << int(layout) << " in " << in
                                                  << " out " << out << " T " << T << " threads " << threads;
            }
  }
  set_threads(0);
}

TEST(Linear, EveryIsaTableMatchesScalar) {
  std::vector<const GemvTable*> tables = {&gemv_table_scalar(), &gemv_table()};
  if (std::string(gemv_table().isa) == "avx512") tables.push_back(&gemv_table_avx2());
  for (const GemvTable* t : tables)
    for (int dt = 0; dt < 3; ++dt)
      for (int64_t in : {1, 7, 16, 33, 100})
        for (int64_t out : {1, 5, 64, 77}) {
          const DType d = dt == 0 ? DType::F32 : dt == 1 ? DType::F16 : DType::BF16;
          const Tensor w = random_tensor({out, in}, d, 3), wt = random_tensor({in, out}, d, 4);
          const Tensor x = random_tensor({in}, DType::F32, 5);
          std::vector<float> got(out), want(out);
          t->out_in[dt](x.data<float>(), w.raw(), in, 0, out, got.data());
          ref::linear(x.data<float>(), 1, {&w, Layout::OutIn}, nullptr, want.data());
          ASSERT_LE(rel_rms(got, want), 1e-5) << t->isa << " out_in dtype " << dt << " " << in << "x" << out;
          t->in_out[dt](x.data<float>(), wt.raw(), out, 0, in, got.data());
          ref::linear(x.data<float>(), 1, {&wt, Layout::InOut}, nullptr, want.data());
          ASSERT_LE(rel_rms(got, want), 1e-5) << t->isa << " in_out dtype " << dt << " " << in << "x" << out;
          // Partial sums over rows [i0, i1): the same as x zero outside them.
          const int64_t i0 = in / 3, i1 = in - in / 4;
          Tensor xs = random_tensor({in}, DType::F32, 5);
          for (int64_t i = 0; i < in; ++i)
            if (i < i0 || i >= i1) xs.data<float>()[i] = 0.0f;
          t->in_out[dt](x.data<float>(), wt.raw(), out, i0, i1, got.data());
          ref::linear(xs.data<float>(), 1, {&wt, Layout::InOut}, nullptr, want.data());
          ASSERT_LE(rel_rms(got, want), 1e-5) << t->isa << " in_out rows " << i0 << ".." << i1 << " dtype " << dt;
          std::vector<float> parts = {1, 2, 3, 4, -5, 6, 7, 8, 9}, sum(2);
          t->sum_parts(parts.data(), 3, 3, 2, sum.data());
          ASSERT_EQ(sum, (std::vector<float>{1 + 4 + 7, 2 - 5 + 8})) << t->isa;
          std::vector<float> wide(out * in), scalar(out * in);
          t->widen[dt](w.raw(), out * in, wide.data());
          gemv_table_scalar().widen[dt](w.raw(), out * in, scalar.data());
          ASSERT_EQ(wide, scalar) << t->isa;
        }
}

// [in, out] weights wider than a partial sum fits in L1: pieces of a few input rows, each partial
// in L2, summed in order; the same result as the reference, at 1 and 2 threads alike.
TEST(Linear, WideInOutGemvMatchesRef) {
  Bf16GemmMode exact(Bf16Products::Exact);
  for (DType dt : {DType::F32, DType::BF16}) {
    constexpr int64_t in = 40, out = 9001;
    const Tensor w = random_tensor({in, out}, dt, 12), b = random_tensor({out}, dt, 13);
    const Tensor x = random_tensor({in}, DType::F32, 14);
    std::vector<float> want(out), one(out), two(out);
    ref::linear(x.data<float>(), 1, {&w, Layout::InOut}, &b, want.data());
    set_threads(1);
    dot_linear(x.data<float>(), 1, {&w, Layout::InOut}, &b, one.data());
    set_threads(2);
    dot_linear(x.data<float>(), 1, {&w, Layout::InOut}, &b, two.data());
    EXPECT_LE(rel_rms(one, want), 1e-5) << dtype_name(dt);
    EXPECT_EQ(one, two) << dtype_name(dt);
  }
  set_threads(0);
}

// Repeated calls give identical bits, for both layouts ([in, out] weights of 2000 rows: several
// pieces, each summed into its own partial by whichever thread takes it).
TEST(Linear, DeterministicForAThreadCount) {
  set_threads(2);
  const Tensor w = random_tensor({300, 200}, DType::BF16, 9), wt = random_tensor({2000, 300}, DType::BF16, 11);
  const Tensor x = random_tensor({7, 2000}, DType::F32, 10);
  std::vector<float> a(7 * 300), b(7 * 300);
  for (int64_t T : {1, 7})
    for (const Weight& W : {Weight{&w, Layout::OutIn}, Weight{&wt, Layout::InOut}})
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> was = a;
        dot_linear(x.data<float>(), T, W, nullptr, a.data());
        if (rep) {
          EXPECT_EQ(a, was) << "T " << T << " layout " << int(W.layout);
        }
      }
  set_threads(0);
}

// "worst element i: got a, want b" for failure messages.
std::string worst(const std::vector<float>& got, const std::vector<float>& want) {
  size_t w = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(double(got[i]) - want[i]) > std::fabs(double(got[w]) - want[w])) w = i;
  std::ostringstream s;
  s << "worst element " << w << ": got " << got[w] << ", want " << want[w];
  return s.str();
}

// The shapes the fast paths are swept over (T = 1 takes the GEMV, T > 1 the GEMM): every combination of awkward sizes up to 2^20
// multiply-adds (the f64 reference dominates the run time), plus large ones that cross several
// reduction slices (KC = 384), column blocks, thread splits and row tiles at once, and blocks of more
// than one panel where the GEMM sums the whole reduction at once (f32 panels at in = 1000 hold two
// 48-column tiles).
std::vector<std::array<int64_t, 3>> awkward_gemm_shapes() {
  std::vector<std::array<int64_t, 3>> shapes;
  const int64_t dims[] = {1, 15, 16, 17, 63, 64, 65, 130, 768, 770};
  for (int64_t T : {1, 2, 3, 17, 64, 65, 513})
    for (int64_t in : dims)
      for (int64_t out : dims)
        if (T * in * out <= (1 << 20)) shapes.push_back({T, in, out});
  for (auto s : {std::array<int64_t, 3>{65, 770, 770}, {513, 770, 65}, {513, 65, 770}, {9, 1000, 1300}})
    shapes.push_back(s);
  return shapes;
}

Tensor rounded_to_bf16(const Tensor& x) {
  Tensor r = Tensor::empty(DType::F32, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) r.data<float>()[i] = bf16_to_f32(f32_to_bf16(x.data<float>()[i]));
  return r;
}

// Every GEMM path this CPU has (T > 1), against the f64 ref:: twin, at 1 and 2 threads:
//   exact path, all dtypes:     relative RMS <= 1e-5;
//   bf16 dot path, BF16 weights: against ref:: fed the same bf16-rounded x, <= 1e-5 (the products are
//   exact in f32 and accumulate in f32, so only the rounding of x separates it from ref::).
// Own GEMMs give bit-identical results at any thread count; OpenBLAS only per thread count.
TEST(Linear, GemmPathsMatchRefOverAwkwardSizes) {
  const bool own = gemm_table().exact != nullptr, dot = gemm_table().bf16_dot != nullptr;
  const std::string paths = std::string(own ? "own AVX-512 GEMM" : "OpenBLAS") + (dot ? " + bf16 dot products" : "");
  RecordProperty("gemm_paths", paths);  // LINEAGE_ISA=avx2|scalar (golden_isa_*) takes the others
  std::printf("GEMM paths: %s (kernel table %s)\n", paths.c_str(), gemm_table().isa);
  Bf16GemmMode restore(Bf16Products::Exact);
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (Layout layout : {Layout::OutIn, Layout::InOut})
      for (auto [T, in, out] : awkward_gemm_shapes()) {
        const Tensor w = random_tensor(layout == Layout::OutIn ? Shape{out, in} : Shape{in, out}, dt, in * 31 + out);
        const Tensor x = random_tensor({T, in}, DType::F32, T * 7 + in), xr = rounded_to_bf16(x);
        const Weight W{&w, layout};
        std::vector<float> want(T * out), want_rounded(T * out), one(T * out), got(T * out);
        ref::linear(x.data<float>(), T, W, nullptr, want.data());
        if (dt == DType::BF16 && dot) ref::linear(xr.data<float>(), T, W, nullptr, want_rounded.data());
        for (bool rounds : {false, true}) {
          if (rounds && !(dt == DType::BF16 && dot)) continue;
          g_dot = rounds;
          const std::vector<float>& ref = rounds ? want_rounded : want;
          for (int threads : {1, 2}) {
            set_threads(threads);
            dot_linear(x.data<float>(), T, W, nullptr, got.data());
            ASSERT_LE(rel_rms(got, ref), 1e-5) << worst(got, ref) << "; dtype " << dtype_name(dt) << " layout " << int(layout)
                                               << " T " << T << " in " << in << " out " << out << " threads " << threads
                                               << (rounds ? " bf16 dot" : " exact");
            if (threads == 1) {
              one = got;
            } else if (own) {
              ASSERT_EQ(got, one) << "threads change the result: " << T << "x" << in << "x" << out;
            }
          }
        }
      }
}

// One token alone (GEMV) gives what the same token gives inside a longer input (GEMM), in both BF16
// modes: the bf16 dot GEMV rounds x exactly as the GEMM does, so only the order of the f32 additions
// differs (~1e-6 over 3072 terms; rounding x differently would show as ~1.7e-3). This is what keeps
// decode and prefill interchangeable (split invariance).
TEST(Linear, OneRowMatchesTheSameRowOfAGemm) {
  Bf16GemmMode restore(Bf16Products::Exact);
  for (bool rounds : {false, true}) {
    g_dot = rounds;
    for (Layout layout : {Layout::OutIn, Layout::InOut})
      for (auto [in, out] : {std::array<int64_t, 2>{768, 2304}, {3072, 768}, {65, 130}, {1, 17}}) {
        constexpr int64_t T = 7;
        const Tensor w = random_tensor(layout == Layout::OutIn ? Shape{out, in} : Shape{in, out}, DType::BF16, in + out);
        const Tensor x = random_tensor({T, in}, DType::F32, 21);
        std::vector<float> all(T * out), one(out);
        dot_linear(x.data<float>(), T, {&w, layout}, nullptr, all.data());
        for (int64_t t = 0; t < T; ++t) {
          dot_linear(x.data<float>() + t * in, 1, {&w, layout}, nullptr, one.data());
          const std::vector<float> row(all.begin() + t * out, all.begin() + (t + 1) * out);
          ASSERT_LE(rel_rms(one, row), 1e-5) << worst(one, row) << (rounds ? "; bf16 dot" : "; exact") << " layout "
                                             << int(layout) << " " << in << "x" << out << " row " << t;
        }
      }
  }
}

// dot_linear() with an activation gives dot_linear() then activate(): GELU fused into the GEMM's store
// (T > 1 on the engine's own GEMM) within the ulps of two exp builds, every other case exactly;
// bias included, both layouts, f32 and bf16 (exact and bf16 dot), 1 and 2 threads.
TEST(Linear, ActivationAfterEqualsActivate) {
  Bf16GemmMode restore(Bf16Products::Exact);
  for (int threads : {1, 2}) {
    set_threads(threads);
    for (bool rounds : {false, true}) {
      g_dot = rounds;
      for (DType dt : {DType::F32, DType::BF16})
        for (Layout layout : {Layout::OutIn, Layout::InOut})
          for (Activation act : {Activation::GeluTanh, Activation::Silu})
            for (int64_t T : {1, 5, 64}) {
              constexpr int64_t in = 96, out = 200;  // 200: a partial 48-column tile at the right edge
              const Tensor w = random_tensor(layout == Layout::OutIn ? Shape{out, in} : Shape{in, out}, dt, 5);
              const Tensor b = random_tensor({out}, dt, 6);
              const Tensor x = random_tensor({T, in}, DType::F32, 7);
              std::vector<float> got(T * out), want(T * out);
              dot_linear(x.data<float>(), T, {&w, layout}, &b, got.data(), act);
              dot_linear(x.data<float>(), T, {&w, layout}, &b, want.data());
              activate(act, want.data(), T * out);
              const std::string where = std::string(dtype_name(dt)) + (rounds ? " bf16 dot" : "") + " layout " +
                                        std::to_string(int(layout)) + " act " + std::to_string(int(act)) + " T " +
                                        std::to_string(T) + " threads " + std::to_string(threads);
              const bool fused = T > 1 && act == Activation::GeluTanh && gemm_table().exact;
              if (fused) ASSERT_LE(rel_rms(got, want), 1e-6) << where;
              else ASSERT_EQ(got, want) << where;
            }
    }
  }
  set_threads(0);
}

// Weights that do not start on a cache line, as a checkpoint's mapped tensors (a safetensors file
// places them 8-byte aligned at best): the GEMV reads the row's elements before its first line
// boundary apart from the vector loop (and, for bf16 rows starting between pairs, not at all). Every
// offset gives the reference's result, both layouts, f32 and bf16, exact and bf16 dot products.
TEST(Linear, WeightsOffTheCacheLineMatchRef) {
  Bf16GemmMode restore(Bf16Products::Exact);
  // in = 200: rows of 800 / 400 bytes, each starting elsewhere in its line; in = 256: every row at the
  // same place, where the f32 [out, in] GEMV moves x to put it on a line beside the peeled rows.
  constexpr int64_t out = 100;
  for (int64_t in : {int64_t(200), int64_t(256)})
    for (DType dt : {DType::F32, DType::BF16})
      for (Layout layout : {Layout::OutIn, Layout::InOut})
        for (size_t offset : {4, 8, 48, 62}) {
          if (offset % dtype_size(dt)) continue;
          const Tensor w = random_tensor(layout == Layout::OutIn ? Shape{out, in} : Shape{in, out}, dt, offset + 40);
          auto bytes = std::make_shared<std::vector<char>>(w.nbytes() + 128);
          char* line = bytes->data() + (64 - reinterpret_cast<uintptr_t>(bytes->data()) % 64) % 64;
          std::memcpy(line + offset, w.raw(), w.nbytes());
          const Tensor shifted = Tensor::borrow(dt, w.shape(), line + offset, bytes);
          ASSERT_NE(reinterpret_cast<uintptr_t>(shifted.raw()) % 64, 0u);
          const Tensor x = random_tensor({in}, DType::F32, 41), xr = rounded_to_bf16(x);
          for (bool rounds : {false, true}) {
            if (rounds && (dt != DType::BF16 || !bf16_dot_available())) continue;
            g_dot = rounds;
            std::vector<float> got(out), want(out);
            dot_linear(x.data<float>(), 1, {&shifted, layout}, nullptr, got.data());
            ref::linear((rounds ? xr : x).data<float>(), 1, {&w, layout}, nullptr, want.data());
            ASSERT_LE(rel_rms(got, want), 1e-5) << worst(got, want) << "; " << dtype_name(dt) << " layout " << int(layout)
                                                << " in " << in << " offset " << offset << (rounds ? " bf16 dot" : "");
          }
        }
}

// A group of linear maps on one input gives what dot_linear() gives for each (one shared parallel
// region for T = 1), with biases, both layouts and all dtypes mixed.
TEST(Linear, GroupEqualsOneCallEach) {
  const Tensor a = random_tensor({300, 200}, DType::F32, 31), b = random_tensor({200, 130}, DType::BF16, 32);
  const Tensor c = random_tensor({7, 200}, DType::F16, 33), bias = random_tensor({130}, DType::F32, 34);
  for (int threads : {1, 2}) {
    set_threads(threads);
    for (int64_t T : {1, 3}) {
      const Tensor x = random_tensor({T, 200}, DType::F32, 35);
      std::vector<float> ya(T * 300), yb(T * 130), yc(T * 7), wa(T * 300), wb(T * 130), wc(T * 7);
      const LinearOut outs[] = {{{&a, Layout::OutIn}, nullptr, ya.data()},
                                {{&b, Layout::InOut}, &bias, yb.data()},
                                {{&c, Layout::OutIn}, nullptr, yc.data()}};
      linear_group(x.data<float>(), T, outs);
      dot_linear(x.data<float>(), T, {&a, Layout::OutIn}, nullptr, wa.data());
      dot_linear(x.data<float>(), T, {&b, Layout::InOut}, &bias, wb.data());
      dot_linear(x.data<float>(), T, {&c, Layout::OutIn}, nullptr, wc.data());
      EXPECT_EQ(ya, wa) << "T " << T << " threads " << threads;
      EXPECT_EQ(yb, wb) << "T " << T << " threads " << threads;
      EXPECT_EQ(yc, wc) << "T " << T << " threads " << threads;
    }
  }
  set_threads(0);
}

// A group member's `then` sees each of its outputs exactly once, already final (bias and act
// applied), on whichever thread finished it; for both layouts (long enough to be split into many
// chunks and pieces), one and two threads.
TEST(Linear, GroupThenSeesEveryFinishedOutputOnce) {
  const Tensor a = random_tensor({3000, 200}, DType::BF16, 41), b = random_tensor({900, 1300}, DType::F32, 42);
  const Tensor bias = random_tensor({1300}, DType::F32, 43);
  const Tensor x = random_tensor({1, 900}, DType::F32, 44), xa = random_tensor({1, 200}, DType::F32, 45);
  for (int threads : {1, 2}) {
    set_threads(threads);
    for (int which : {0, 1}) {
      const Tensor& w = which ? b : a;
      const Layout layout = which ? Layout::InOut : Layout::OutIn;
      const int64_t out = which ? 1300 : 3000;
      const float* in = which ? x.data<float>() : xa.data<float>();
      const auto n = static_cast<size_t>(out);
      std::vector<float> y(n), want(n), seen(n, 0.0f);
      std::vector<std::atomic<int>> calls(n);
      LinearOut o{{&w, layout}, which ? &bias : nullptr, y.data(), Activation::Silu};
      o.then = [&](int64_t o0, int64_t o1) {
        for (int64_t i = o0; i < o1; ++i) {
          calls[size_t(i)].fetch_add(1);
          seen[size_t(i)] = y[size_t(i)];
        }
      };
      linear_group(in, 1, {&o, 1});
      dot_linear(in, 1, {&w, layout}, which ? &bias : nullptr, want.data(), Activation::Silu);
      for (int64_t i = 0; i < out; ++i) {
        ASSERT_EQ(calls[size_t(i)].load(), 1) << "output " << i << " layout " << which << " threads " << threads;
        ASSERT_EQ(seen[size_t(i)], want[size_t(i)]) << "output " << i << " layout " << which << " threads " << threads;
      }
      if (threads == 1) {
        EXPECT_DEATH(linear_group(in, 2, {&o, 1}), "`then` is for one token");
      }
    }
  }
  set_threads(0);
}

// The bf16 dot path against the true f64 product. Rounding x to bf16 (8 significant bits) gives each
// x·w term an independent relative error, so the sum's relative RMS error is the RMS rounding error
// of x weighted by x²: 2^-7 / sqrt(28) ≈ 1.5e-3 for values spread evenly over an octave, 1.66e-3 for
// normal x (simulated), 1.67e-3 measured here on GPT-2 shapes. Bound 2.5e-3: half again as much.
TEST(Linear, Bf16DotPathErrorAgainstF64Ref) {
  if (!gemm_table().bf16_dot) GTEST_SKIP() << "CPU lacks AVX512_BF16 (or LINEAGE_ISA forced a lower ISA)";
  Bf16GemmMode mode(Bf16Products::Dot);
  for (auto [T, in, out, layout] : {std::array<int64_t, 4>{64, 768, 2304, 1}, {33, 3072, 768, 1}, {40, 768, 4000, 0},
                                    {1, 768, 2304, 1}, {1, 768, 4000, 0}}) {
    const Layout l = layout ? Layout::InOut : Layout::OutIn;
    const Tensor w = random_tensor(l == Layout::OutIn ? Shape{out, in} : Shape{in, out}, DType::BF16, 11);
    const Tensor x = random_tensor({T, in}, DType::F32, 12);
    std::vector<float> got(T * out), want(T * out), again(T * out);
    dot_linear(x.data<float>(), T, {&w, l}, nullptr, got.data());
    ref::linear(x.data<float>(), T, {&w, l}, nullptr, want.data());
    const double err = rel_rms(got, want);
    std::printf("bf16 dot path %ldx%ldx%ld: relative RMS error %.3g\n", long(T), long(in), long(out), err);
    EXPECT_LE(err, 2.5e-3) << worst(got, want) << "; " << T << "x" << in << "x" << out;
    EXPECT_GE(err, 1e-4) << "the bf16 dot path did not run (error " << err << " looks like the exact path)";
    dot_linear(x.data<float>(), T, {&w, l}, nullptr, again.data());
    EXPECT_EQ(got, again);
  }
  // The switch leaves F32 and F16 weights on the exact path.
  for (DType dt : {DType::F32, DType::F16}) {
    const Tensor w = random_tensor({770, 130}, dt, 13);
    const Tensor x = random_tensor({17, 770}, DType::F32, 14);
    std::vector<float> got(17 * 130), want(17 * 130);
    dot_linear(x.data<float>(), 17, {&w, Layout::InOut}, nullptr, got.data());
    ref::linear(x.data<float>(), 17, {&w, Layout::InOut}, nullptr, want.data());
    EXPECT_LE(rel_rms(got, want), 1e-5) << worst(got, want) << "; dtype " << dtype_name(dt);
  }
}

TEST(DType, ConversionsRoundTripAndRound) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // halfway 1 + 2^-8: ties to even
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
}

}  // namespace
}  // namespace linear_test
}  // namespace lineage::kernels

namespace lineage::kernels {
namespace linear_test {
namespace {

// 2 to 8 rows of x against [out, in] weights: each row bit for bit what it gives alone (the rows
// GEMV runs the lone GEMV's operations in its order), every dtype, exact and bf16 dot products, odd
// shapes (a partial last vector, a block of four weight rows cut short), weights off the cache line,
// one and two threads.
TEST(Linear, FewRowsAreEachRowAloneBitForBit) {
  for (int threads : {1, 2}) {
    set_threads(threads);
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
      for (bool dot : {false, true}) {
        if (dot && (dt != DType::BF16 || !bf16_dot_available())) continue;
        for (auto [in, out] : {std::array<int64_t, 2>{768, 130}, {200, 67}, {33, 9}, {256, 5}})
          for (size_t offset : {size_t(0), size_t(48)}) {
            const Tensor w0 = random_tensor({out, in}, dt, in + out);
            auto bytes = std::make_shared<std::vector<char>>(w0.nbytes() + 128);
            char* line = bytes->data() + (64 - reinterpret_cast<uintptr_t>(bytes->data()) % 64) % 64;
            std::memcpy(line + offset, w0.raw(), w0.nbytes());
            const Tensor w = Tensor::borrow(dt, w0.shape(), line + offset, bytes);
            const Weight W{&w, Layout::OutIn, dot};
            for (int64_t T = 2; T <= 8; ++T) {
              const Tensor x = random_tensor({T, in}, DType::F32, T * 13 + in);
              std::vector<float> all(T * out), one(out);
              linear(x.data<float>(), T, W, nullptr, all.data());
              for (int64_t t = 0; t < T; ++t) {
                linear(x.data<float>() + t * in, 1, W, nullptr, one.data());
                ASSERT_EQ(std::vector<float>(all.begin() + t * out, all.begin() + (t + 1) * out), one)
                    << dtype_name(dt) << (dot ? " bf16 dot" : "") << " " << in << "x" << out << " offset " << offset
                    << " T " << T << " row " << t << " threads " << threads;
              }
            }
          }
      }
  }
  set_threads(0);
}

}  // namespace
}  // namespace linear_test
}  // namespace lineage::kernels
