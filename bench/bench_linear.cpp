// kernels::linear on GPT-2 small's shapes: GEMV (T = 1, decode), bound by reading the weight once
// from memory, and GEMM (T = 512, prefill), bound by the multiply-adds; F32 / F16 / BF16 weights,
// both layouts; BF16 both exact ("bf16": widened to f32, the --bf16-exact path) and with bf16 dot
// products ("bf16dot": vdpbf16ps on activations rounded to bf16, the default where the CPU has
// AVX512_BF16). Each call takes the next of several copies of the weight
// (cold_weights). `gemv_mapped` rows read the copies mapped from a file, as a checkpoint's weights
// are read by default (page-cache pages in the folios the file system made as the file was written:
// some 4 KiB; the other rows' copies sit on huge pages, as presets' and --no-mmap's weights do).
// `linear/*/mxfp4/*` rows: Kimi K3's routed experts (MXFP4 codes and E8M0 exponents, both counted in
// the bytes read), GEMV, a step of 8 tokens and a T = 512 GEMM, at the expert's two shapes, exact
// (`mxfp4`, --bf16-exact) and in the bf16 dot mode (`mxfp4_bf16dot`, the default where the CPU has
// AVX512_BF16).
// `linear/*/{w4a16,w8a16,fp8_block,nvfp4}/*` rows: lineage quantize's formats (codes and scales counted
// in the bytes read) at Kimi-Linear's and Qwen3-Next's expert and attention shapes; `*_int8dot` rows
// the int4 and int8 codes in the int8-activation mode (kernels::int8_dot_available: AVX512_VNNI), its
// GEMM still given against the f32 peak. `linear/*/gguf_*/*` rows: GGUF's block formats (Q8_0, Q4_K, Q5_K,
// Q6_K, Q4_0, MXFP4) at those shapes, random blocks, exact (each weight's defined value, f32 products).
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.h"
#include "lineage/core/dtype.h"
#include "lineage/core/rng.h"
#include "lineage/io/quantize.h"
#include "lineage/io/rtn.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/random_blocks.h"

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

// Copies of one random [out, in] MXFP4 matrix (uniform codes, exponents 120..130) past kColdBytes
// together, as cold_weights makes them; the last set is kept.
const std::vector<kernels::Matrix>& cold_mxfp4(int64_t out, int64_t in) {
  static std::vector<kernels::Matrix> last;
  if (!last.empty() && last[0].out == out && last[0].in == in) return last;
  last.clear();
  kernels::Matrix m;
  m.out = out, m.in = in, m.packed = true;
  m.data = Tensor::empty(DType::U8, {out, in / 2});
  m.scales = Tensor::empty(DType::U8, {out, in / 32});
  Rng rng(3);
  for (int64_t i = 0; i < m.data.numel(); ++i) m.data.data<uint8_t>()[i] = uint8_t(rng.next_u64());
  for (int64_t i = 0; i < m.scales.numel(); ++i) m.scales.data<uint8_t>()[i] = uint8_t(120 + rng.next_u64() % 11);
  const size_t copies = (kColdBytes + m.bytes() - 1) / m.bytes();
  for (size_t i = 0; i < copies; ++i) {
    kernels::Matrix c = m;
    c.data = m.data.clone(), c.scales = m.scales.clone();
    last.push_back(std::move(c));
  }
  return last;
}

// `T` rows of x through the next of the copies `w` at each call (their stored bytes counted as read),
// bf16_dot as linear() takes it.
void bm_matrices(benchmark::State& state, const std::vector<kernels::Matrix>& w, LinearShape s, int64_t T,
                 bool bf16_dot = false) {
  const auto x = random_floats(T * s.in, 2);
  std::vector<float> y(static_cast<size_t>(T * s.out));
  size_t next = 0;
  Work work;
  work.bytes = double(w[0].bytes());
  work.flops = 2.0 * double(T) * double(s.in) * double(s.out);
  work.memory_bound = T == 1;
  run(state, work, [&] {
    kernels::linear(x.data(), T, w[next], nullptr, y.data(), std::nullopt, bf16_dot);
    next = (next + 1) % w.size();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  });
}

void bm_mxfp4(benchmark::State& state, LinearShape s, int64_t T, bool bf16_dot) {
  bm_matrices(state, cold_mxfp4(s.out, s.in), s, T, bf16_dot);
}

// Copies of one random [out, in] bf16 matrix quantized by lineage quantize's RTN (io/rtn.h) as `scheme`
// stores it, prepared as the loader prepares it, past kColdBytes together; the last set is kept.
const std::vector<kernels::Matrix>& cold_quantized(int64_t out, int64_t in, io::RtnScheme scheme) {
  static std::vector<kernels::Matrix> last;
  static io::RtnScheme last_scheme{};
  if (!last.empty() && last[0].out == out && last[0].in == in && last_scheme == scheme) return last;
  last.clear();
  last_scheme = scheme;
  Tensor w = Tensor::empty(DType::BF16, {out, in});
  const auto v = random_floats(out * in, 5, 0.05f);
  for (int64_t i = 0; i < out * in; ++i) w.data<uint16_t>()[i] = f32_to_bf16(v[size_t(i)]);
  const io::RtnArgs args{scheme, 128, 0};
  const auto parts = io::rtn_quantize(w, args);
  kernels::Matrix m;
  m.out = out, m.in = in;
  using Kind = kernels::StoredQuant::Kind;
  switch (scheme) {
    case io::RtnScheme::FP8_BLOCK: m.quant = {Kind::Fp8, 0, 0, 128, 128, true, "bench"}; break;
    case io::RtnScheme::NVFP4: m.quant = {Kind::Nvfp4, 0, 0, 0, 0, true, "bench"}; break;
    default: m.quant = {Kind::PackedInt, scheme == io::RtnScheme::W8A16 ? 8 : 4, 128, 0, 0, true, "bench"}; break;
  }
  size_t bytes = 0;
  for (const auto& [suffix, t] : parts) bytes += t.nbytes();
  const size_t copies = (kColdBytes + bytes - 1) / bytes;
  for (size_t i = 0; i < copies; ++i) {
    kernels::Matrix c = m;
    for (const auto& [suffix, t] : parts) {
      Tensor& dst = suffix == "weight_packed" || suffix == "weight" ? c.data
                    : suffix == "weight_scale"                       ? c.scales
                    : suffix == "weight_global_scale"                ? c.global_scale
                                                                     : c.weight_shape;
      dst = t.clone();
    }
    kernels::prepare_quant(c, "bench.weight");
    last.push_back(std::move(c));
  }
  return last;
}

// int8_dot: the int8-activation mode (kernels::int8_dot_available; the copies share their tensors).
void bm_quantized(benchmark::State& state, LinearShape s, io::RtnScheme scheme, int64_t T, bool int8_dot) {
  if (!int8_dot) return bm_matrices(state, cold_quantized(s.out, s.in, scheme), s, T);
  std::vector<kernels::Matrix> w = cold_quantized(s.out, s.in, scheme);
  for (kernels::Matrix& m : w) m.qw.int8_dot = true;
  bm_matrices(state, w, s, T);
}

// Copies of one [out, in] matrix of random ggml blocks (packed_test::random_blocks) past kColdBytes
// together, prepared as the GGUF loader prepares them; the last set is kept.
const std::vector<kernels::Matrix>& cold_ggml(int64_t out, int64_t in, kernels::GgmlBlock type) {
  static std::vector<kernels::Matrix> last;
  if (!last.empty() && last[0].out == out && last[0].in == in && last[0].quant.ggml == type) return last;
  last.clear();
  const kernels::Matrix m = kernels::packed_test::random_blocks(type, out, in, 3);
  const size_t copies = (kColdBytes + m.bytes() - 1) / m.bytes();
  for (size_t i = 0; i < copies; ++i) {
    kernels::Matrix c = m;
    c.data = m.data.clone();
    kernels::prepare_quant(c, "bench.weight");
    last.push_back(std::move(c));
  }
  return last;
}

void bm_ggml(benchmark::State& state, LinearShape s, kernels::GgmlBlock type, int64_t T) {
  bm_matrices(state, cold_ggml(s.out, s.in, type), s, T);
}

// Kimi-Linear-48B-A3B's routed expert (width 2304, expert 1024) and MLA q_proj (2304 -> 32 x 192);
// Qwen3-Next-80B-A3B's expert (2048, expert 512) and attention q_proj with its gate (2048 -> 2 x 16 x 256).
constexpr LinearShape kQuantShapes[] = {{"kimi_expert_gate_up", 2304, 1024}, {"kimi_expert_down", 1024, 2304},
                                        {"kimi_q_proj", 2304, 6144},         {"qwen_expert_gate_up", 2048, 512},
                                        {"qwen_expert_down", 512, 2048},     {"qwen_q_proj", 2048, 8192}};

// Kimi K3's routed expert (model width 3584, expert width 3072): gate and up, then down.
constexpr LinearShape kExpertShapes[] = {{"expert_gate_up", 3584, 3072}, {"expert_down", 3072, 3584}};

const bool registered = [] {
  for (const auto& [T, variant] : {std::pair<int64_t, const char*>{1, "gemv"}, {8, "batch8"}, {512, "gemm_T512"}})
    for (const LinearShape& s : kExpertShapes)
      for (bool dot : {false, true}) {
        if (dot && !kernels::bf16_dot_available()) continue;
        const std::string name = std::string("linear/") + variant + (dot ? "/mxfp4_bf16dot" : "/mxfp4") + "/out_in/" +
                                 s.name + "_" + std::to_string(s.in) + "x" + std::to_string(s.out);
        benchmark::RegisterBenchmark(name.c_str(), bm_mxfp4, s, T, dot)->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
  for (const auto& [T, variant] : {std::pair<int64_t, const char*>{1, "gemv"}, {8, "batch8"}, {512, "gemm_T512"}})
    for (const io::RtnScheme scheme : {io::RtnScheme::W4A16, io::RtnScheme::W8A16, io::RtnScheme::FP8_BLOCK, io::RtnScheme::NVFP4})
      for (const LinearShape& s : kQuantShapes) {
        std::string label = io::rtn_scheme_name(scheme);
        for (char& c : label) c = char(std::tolower(static_cast<unsigned char>(c)));
        const std::string name = std::string("linear/") + variant + "/" + label + "/out_in/" + s.name + "_" +
                                 std::to_string(s.in) + "x" + std::to_string(s.out);
        benchmark::RegisterBenchmark(name.c_str(), bm_quantized, s, scheme, T, false)->UseRealTime()->Unit(benchmark::kMicrosecond);
        if (kernels::int8_dot_available() && (scheme == io::RtnScheme::W4A16 || scheme == io::RtnScheme::W8A16)) {
          const std::string dot = std::string("linear/") + variant + "/" + label + "_int8dot/out_in/" + s.name + "_" +
                                  std::to_string(s.in) + "x" + std::to_string(s.out);
          benchmark::RegisterBenchmark(dot.c_str(), bm_quantized, s, scheme, T, true)->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
      }
  // GGUF's block formats (ggml's, computed on their blocks) at the same shapes.
  for (const auto& [T, variant] : {std::pair<int64_t, const char*>{1, "gemv"}, {8, "batch8"}, {512, "gemm_T512"}})
    for (const kernels::GgmlBlock type : {kernels::GgmlBlock::Q8_0, kernels::GgmlBlock::Q4_K, kernels::GgmlBlock::Q6_K,
                                          kernels::GgmlBlock::Q5_K, kernels::GgmlBlock::Q4_0, kernels::GgmlBlock::MXFP4})
      for (const LinearShape& s : kQuantShapes) {
        std::string label = std::string("gguf_") + kernels::ggml_block_info(type).name;
        for (char& c : label) c = char(std::tolower(static_cast<unsigned char>(c)));
        const std::string name = std::string("linear/") + variant + "/" + label + "/out_in/" + s.name + "_" +
                                 std::to_string(s.in) + "x" + std::to_string(s.out);
        benchmark::RegisterBenchmark(name.c_str(), bm_ggml, s, type, T)->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
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
