// Data-free round-to-nearest quantization of one weight matrix, bit for bit as llm-compressor's presets
// compute it (spec quantized-formats.md §2.2, §6.2a): every step rounded to the weights' dtype (the
// scales' dtype), x / scale rounded there before it is rounded to a code, ties to even. The results
// are the stored tensors of compressed-tensors' layouts (kernels/matrix.h, StoredQuant).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::io {

enum class RtnScheme : uint8_t { W4A16, W4A16_ASYM, W8A16, FP8_BLOCK, MXFP4, NVFP4 };

struct RtnArgs {
  RtnScheme scheme = RtnScheme::W4A16;
  int64_t group = 128;  // int schemes: columns per scale; 0 = one per row (channel)
  // NVFP4: max |w| over the matrices that share this one's global scale (q/k/v, gate/up of one
  // module); 0 = this matrix's own.
  double nvfp4_amax = 0;
};

// W [out, in] (F32, F16 or BF16) quantized: {suffix, tensor} pairs to store beside the module's name
// ("weight_packed", "weight_scale", ...; FP8: "weight" itself), in the order a writer lists them.
std::vector<std::pair<std::string, Tensor>> rtn_quantize(const Tensor& W, const RtnArgs& args);

// The stored tensors rtn_quantize writes for a matrix of `shape` and `dtype`: suffix, dtype, shape, in
// its order (a writer declares them before any is computed).
struct RtnPart {
  std::string suffix;
  DType dtype;
  Shape shape;
};
std::vector<RtnPart> rtn_layout(const Shape& shape, DType dtype, const RtnArgs& args);

// Why W cannot take the scheme ("" when it can): its dtype, or rows that are no whole number of groups.
std::string rtn_unfit(const Shape& shape, DType dtype, const RtnArgs& args);

// max |w| over W's elements (NVFP4's fused global scale).
double rtn_amax(const Tensor& W);

// The stored float values of the codes (tests): an FP8 byte, a 4-bit E2M1 code.
uint8_t e4m3_encode(double x);
uint8_t e2m1_encode(double x);

}  // namespace lineage::io
