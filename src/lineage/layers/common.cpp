#include "lineage/layers/common.h"

#include <cstdint>
#include <string>

namespace lineage::layers {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

void visit_quantized(const TensorVisitor& f, const std::string& name, kernels::Matrix& m) {
  using Kind = kernels::StoredQuant::Kind;
  const kernels::StoredQuant& q = m.quant;
  const int64_t out = m.out, in = m.in;
  // One scale per block of rows and columns (0: per row; -1: one for the matrix).
  const auto block_shape = [&]() -> Shape {
    if (q.block_rows < 0) return {1};
    if (q.block_rows == 0) return {out, 1};
    return {ceil_div(out, q.block_rows), ceil_div(in, q.block_cols)};
  };
  switch (q.kind) {
    case Kind::PackedInt: {
      const int64_t groups = q.group ? ceil_div(in, q.group) : 1;
      f(name + "_packed", m.data, {out, ceil_div(in * q.bits, 32)}, Init::Custom);
      f(name + "_scale", m.scales, {out, groups}, Init::Custom);
      if (!q.symmetric) f(name + "_zero_point", m.zero_point, {ceil_div(out * q.bits, 32), groups}, Init::Custom);
      f(name + "_shape", m.weight_shape, {2}, Init::Custom);
      return;
    }
    case Kind::Fp8:
      f(name, m.data, {out, in}, Init::Custom);
      f(name + "_scale", m.scales, block_shape(), Init::Custom);
      return;
    case Kind::HfFp8:
      f(name, m.data, {out, in}, Init::Custom);
      f(name + "_scale_inv", m.scales, block_shape(), Init::Custom);
      return;
    case Kind::Nvfp4:
      f(name + "_packed", m.data, {out, in / 2}, Init::Custom);
      f(name + "_scale", m.scales, {out, ceil_div(in, 16)}, Init::Custom);
      f(name + "_global_scale", m.global_scale, {1}, Init::Custom);
      return;
    case Kind::Ggml: {
      const kernels::GgmlBlockInfo& b = kernels::ggml_block_info(q.ggml);
      f(name, m.data, {out, ceil_div(in, b.values) * b.bytes}, Init::Custom);
      return;
    }
    case Kind::None: return;
  }
}

}  // namespace lineage::layers
