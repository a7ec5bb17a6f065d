// kernels::linear on GPT-2 small's shapes: GEMV (T = 1, decode), bound by reading the weight once
// from memory, and GEMM (T = 512, prefill), bound by the multiply-adds; F32 / F16 / BF16 weights,
// both layouts; BF16 both exact ("bf16": widened to f32, the --bf16-exact path) and with bf16 dot
// products ("bf16dot": vdpbf16ps on activations rounded to bf16, the default where the CPU has
// AVX512_BF16). Each call takes the next of several copies of the weight
// (cold_weights). `gemv_mapped` rows read the copies mapped from a file, as a checkpoint's weights
// are read by default (page-cache pages in the folios the file system made as the file was written:
// some 4 KiB; the other rows' copies sit on huge pages, as presets' and --no-mmap's weights do).
#include <string>

#include "bench_support.h"
#include "lineage/kernels/linear.h"

namespace lineage::bench {
namespace {

struct LinearShape {
  const char* name;
  int64_t in, out;
};
constexpr LinearShape kShapes[] = {{"c_attn", 768, 2304},    {"attn_c_proj", 768, 768}, {"c_fc", 768, 3072},
                                   {"mlp_c_proj", 3072, 768}, {"lm_head", 768, 50257}};

void bm_linear(benchmark::State& state, LinearShape s, DType dtype, kernels::Layout layout, int64_t T, bool dot,
               bool mapped) {
  const bool out_in = layout == kernels::Layout::OutIn;
  const int64_t rows = out_in ? s.out : s.in, cols = out_in ? s.in : s.out;
  const std::vector<Tensor>& w = mapped ? mapped_cold_weights(rows, cols, dtype) : cold_weights(rows, cols, dtype);
  const auto x = random_floats(T * s.in, 2);
  std::vector<float> y(static_cast<size_t>(T * s.out));
  size_t next = 0;
  Work work;
  work.bytes = double(w[0].nbytes());
  work.flops = 2.0 * double(T) * double(s.in) * double(s.out);
  work.memory_bound = T == 1;
  work.weights = dtype;
  run(state, work, [&] {
    kernels::linear(x.data(), T, {&w[next], layout, dot}, nullptr, y.data());
    next = (next + 1) % w.size();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  });
}

const bool registered = [] {
  const bool dot_available = kernels::bf16_dot_available();
  struct Variant {
    int64_t T;
    bool mapped;
    const char* name;
  };
  // batch8 / batch32: a step of 8 or 32 decoding sequences, each weight read once for all of them.
  for (const Variant v : {Variant{1, false, "gemv"}, Variant{1, true, "gemv_mapped"}, Variant{8, false, "batch8"},
                          Variant{32, false, "batch32"}, Variant{512, false, "gemm_T512"}})
    for (const LinearShape& s : kShapes) {
      if (v.T > 1 && std::string(s.name) == "lm_head") continue;  // prefill runs the head for one token only
      for (DType dt : {DType::F32, DType::F16, DType::BF16})
        for (bool dot : {false, true}) {
          if (v.T > 1 && v.T < 512 && dt == DType::F16) continue;
          if (dot && (dt != DType::BF16 || !dot_available)) continue;
          // Mapped rows: F32 and BF16 at two shapes show the pages' cost (each set is a 512 MiB file
          // write, so not every shape and dtype).
          if (v.mapped && (dt == DType::F16 || (std::string(s.name) != "c_fc" && std::string(s.name) != "lm_head")))
            continue;
          for (kernels::Layout layout : {kernels::Layout::OutIn, kernels::Layout::InOut}) {
            const std::string name = std::string("linear/") + v.name + "/" +
                                     (dot ? std::string("bf16dot") : dtype_label(dt)) +
                                     (layout == kernels::Layout::OutIn ? "/out_in/" : "/in_out/") + s.name + "_" +
                                     std::to_string(s.in) + "x" + std::to_string(s.out);
            benchmark::RegisterBenchmark(name.c_str(), bm_linear, s, dt, layout, v.T, dot, v.mapped)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
          }
        }
    }
  return true;
}();

}  // namespace
}  // namespace lineage::bench
