// A quantization_config and the quantized tensors it describes: section 0 is the config's JSON
// (model::parse_quantization, as config.json holds it), section 1 the bytes the stored tensors of each
// group's layout are filled from (kernels/matrix.h, StoredQuant), each tensor's dtype picked by a byte
// among those a checkpoint may hold. A matrix that prepare_quant accepts runs through linear() (GEMV,
// rows GEMV, GEMM) and must give ref::linear's results where they are finite; everything else must be
// an Error.
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/layers/common.h"
#include "lineage/model/quantization.h"

using namespace lineage;

namespace {

// Bytes of section 1, handed out in order and reused from the start when they run out.
struct Bytes {
  std::string_view s;
  size_t at = 0;
  uint8_t next() { return s.empty() ? uint8_t(0x3c) : uint8_t(s[at++ % s.size()]); }
};

DType pick(Bytes& b, std::initializer_list<DType> ok) { return ok.begin()[b.next() % ok.size()]; }

// The dtypes a checkpoint may store for each tensor of a quantized matrix (the loader's own checks
// pick among them).
DType dtype_for(const std::string& name, Bytes& b) {
  if (name.ends_with("_packed")) return pick(b, {DType::I32, DType::U8});
  if (name.ends_with("_scale")) return pick(b, {DType::BF16, DType::F32, DType::F16, DType::F8_E4M3, DType::U8});
  if (name.ends_with("_zero_point")) return pick(b, {DType::I32, DType::I64});
  if (name.ends_with("_shape")) return pick(b, {DType::I64, DType::I32});
  if (name.ends_with("_global_scale") || name.ends_with("_scale_inv")) return pick(b, {DType::F32, DType::BF16});
  return pick(b, {DType::F8_E4M3, DType::BF16});
}

// linear() against the definition: each output within 1e-4 of Σ|x·w| of the double sum of the decoded
// values (f32 sums may cancel), where that sum is finite.
void check_matrix(const kernels::Matrix& m) {
  const int64_t in = m.in, out = m.out;
  std::vector<float> x(size_t(9 * in)), got(size_t(9 * out));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.25f;
  for (int64_t T : {1, 3, 9}) {
    kernels::linear(x.data(), T, m, nullptr, got.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double sum = 0, mag = 0;
        for (int64_t c = 0; c < in; ++c) {
          const double p = double(x[size_t(t * in + c)]) * double(kernels::ref::quant_element(m.qw, o, c));
          sum += p, mag += std::fabs(p);
        }
        const double g = got[size_t(t * out + o)];
        if (std::isfinite(mag) && mag < 1e30 && !(std::fabs(g - sum) <= 1e-4 * mag + 1e-30))
          fuzz::violated(cat("T ", T, " row ", t, " output ", o, ": linear gives ", g, ", the definition ", sum));
      }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto sections = fuzz::split_sections(std::string_view(reinterpret_cast<const char*>(data), size));
  nlohmann::json cfg;
  try {
    cfg = {{"quantization_config", nlohmann::json::parse(sections[0])}};
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  const auto plan = fuzz::load_or_reject([&] { return model::parse_quantization(model::ConfigFields(cfg, "config.json")); });
  if (!plan) return 0;
  Bytes bytes{sections.size() > 1 ? sections[1] : std::string_view()};
  for (const auto& g : plan->groups) {
    if (!g.stored.defined()) continue;
    for (const int64_t in : {int64_t(64), int64_t(96)}) {
      kernels::Matrix m;
      m.quant = g.stored;
      m.out = 5 + bytes.next() % 4, m.in = in;
      // The stored tensors at the shapes visit_quantized names, filled from the input.
      layers::visit_quantized(
          [&](const std::string& name, Tensor& t, const Shape& shape, layers::Init) {
            t = Tensor::empty(dtype_for(name, bytes), shape);
            auto* p = static_cast<uint8_t*>(t.raw_mut());
            for (size_t i = 0; i < t.nbytes(); ++i) p[i] = bytes.next();
            if (name.ends_with("_shape") && bytes.next() % 4) {  // mostly the right shape
              for (int64_t k = 0; k < 2; ++k) {
                const int64_t v = k ? in : m.out;
                if (t.dtype() == DType::I64) t.data<int64_t>()[k] = v;
                else t.data<int32_t>()[k] = int32_t(v);
              }
            }
          },
          "model.layers.0.mlp.down_proj.weight", m);
      if (!fuzz::load_or_reject([&] {
            kernels::prepare_quant(m, "model.layers.0.mlp.down_proj.weight");
            return true;
          }))
        continue;
      check_matrix(m);
    }
  }
  return 0;
}
