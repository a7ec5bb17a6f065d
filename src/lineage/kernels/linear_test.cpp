// Fast linear (GEMV / GEMM, every ISA table this CPU has) against the scalar ref:: twin, over
// awkward sizes, all weight dtypes and layouts, 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
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

TEST(Linear, MatchesRefOverSizesDtypesLayoutsThreads) {
  const int64_t sizes[] = {1, 3, 15, 16, 17, 63, 64, 65, 130};
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
              linear(x.data<float>(), T, W, &b, got.data());
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
          t->in_out[dt](x.data<float>(), wt.raw(), in, out, 0, out, got.data());
          ref::linear(x.data<float>(), 1, {&wt, Layout::InOut}, nullptr, want.data());
          ASSERT_LE(rel_rms(got, want), 1e-5) << t->isa << " in_out dtype " << dt << " " << in << "x" << out;
          std::vector<float> wide(out * in), scalar(out * in);
          t->widen[dt](w.raw(), out * in, wide.data());
          gemv_table_scalar().widen[dt](w.raw(), out * in, scalar.data());
          ASSERT_EQ(wide, scalar) << t->isa;
        }
}

TEST(Linear, DeterministicForAThreadCount) {
  set_threads(2);
  const Tensor w = random_tensor({300, 200}, DType::BF16, 9);
  const Tensor x = random_tensor({7, 200}, DType::F32, 10);
  std::vector<float> a(7 * 300), b(7 * 300);
  for (int64_t T : {1, 7}) {
    linear(x.data<float>(), T, {&w, Layout::OutIn}, nullptr, a.data());
    linear(x.data<float>(), T, {&w, Layout::OutIn}, nullptr, b.data());
    EXPECT_EQ(a, b);
  }
  set_threads(0);
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
}  // namespace lineage::kernels
