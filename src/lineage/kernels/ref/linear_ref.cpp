#include "lineage/kernels/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/error.h"

namespace lineage::kernels::ref {

double mxfp4_element(const Tensor& codes, const Tensor& scales, int64_t o, int64_t c) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const uint8_t byte = static_cast<const uint8_t*>(codes.raw())[o * codes.dim(1) + c / 2];
  const int code = c % 2 ? byte >> 4 : byte & 15;
  const int s = static_cast<const uint8_t*>(scales.raw())[o * scales.dim(1) + c / 32];
  if (s == 255) return std::nan("");
  return (code & 8 ? -1.0 : 1.0) * kMagnitude[code & 7] * std::ldexp(1.0, s - 127);
}

float quant_element(const QuantWeight& W, int64_t o, int64_t c) {
  static constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint8_t* row = W.q + o * W.row_bytes;
  if (W.codes == QuantCodes::Ggml) {
    const GgmlBlockInfo& b = ggml_block_info(W.ggml);
    float block[256];
    ggml_decode_block(W.ggml, row + c / b.values * b.bytes, block);
    return block[c % b.values];
  }
  float v = 0.0f;
  switch (W.codes) {
    case QuantCodes::Int4: v = float((c % 2 ? row[c / 2] >> 4 : row[c / 2] & 15) - 8); break;
    case QuantCodes::Fp4: {
      const int u = c % 2 ? row[c / 2] >> 4 : row[c / 2] & 15;
      v = u & 8 ? -kE2m1[u & 7] : kE2m1[u & 7];
      break;
    }
    case QuantCodes::Int8: v = float(int(row[c]) - 128); break;
    case QuantCodes::Fp8: v = e4m3_to_f32(row[c]); break;
    case QuantCodes::Ggml: break;
  }
  const int64_t g = c / W.group;
  const float z = W.zero ? W.zero[o * W.groups + g] : 0.0f;
  return (v - z) * W.scale[o * W.groups + g];
}

void quantize_x_int8(const float* x, int64_t n, int8_t* q, float* d) {
  for (int64_t b = 0; b * 32 < n; ++b) {
    float amax = 0.0f;
    bool nan = false;
    for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
      if (std::isnan(x[c])) nan = true;
      else amax = std::max(amax, std::fabs(x[c]));
    }
    d[b] = nan ? std::nanf("") : amax / 127.0f;
    for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
      const float r = amax > 0.0f ? std::nearbyint(x[c] * (127.0f / amax)) : 0.0f;
      q[c] = std::isnan(r) ? 0 : int8_t(std::clamp(r, -127.0f, 127.0f));  // NaN: x NaN, or ±inf · 0
    }
  }
}

namespace {

// The int8-activation mode: the integer products of the codes' values less the zero points with x's
// codes, scaled by scale · d, summed in double.
void linear_quant_int8(const float* x, int64_t T, const Weight& W, const std::vector<float>& b, float* y) {
  const QuantWeight& q = *W.quant;
  const int64_t in = W.in(), out = W.out();
  std::vector<int8_t> xq(in);
  std::vector<float> d(in / 32);
  for (int64_t t = 0; t < T; ++t) {
    quantize_x_int8(x + t * in, in, xq.data(), d.data());
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t c = 0; c < in; ++c) {
        const uint8_t* row = q.q + o * q.row_bytes;
        const int v = q.codes == QuantCodes::Int4 ? (c % 2 ? row[c / 2] >> 4 : row[c / 2] & 15) - 8 : int(row[c]) - 128;
        const int64_t g = c / q.group;
        const double z = q.zero ? q.zero[o * q.groups + g] : 0.0;
        acc += (double(v) - z) * double(xq[c]) * double(q.scale[o * q.groups + g]) * double(d[c / 32]);
      }
      y[t * out + o] = float(acc);
    }
  }
}

void linear_quant(const float* x, int64_t T, const Weight& W, const std::vector<float>& b, float* y) {
  if (kernels::runs_int8_dot(*W.quant)) return linear_quant_int8(x, T, W, b, y);  // where the kernels take it
  const int64_t in = W.in(), out = W.out();
  std::vector<double> row(in);
  for (int64_t o = 0; o < out; ++o) {
    if (W.quant->codes == QuantCodes::Ggml) {
      std::vector<float> decoded(static_cast<size_t>(in));
      ggml_decode_row(W.quant->ggml, W.quant->q + o * W.quant->row_bytes, in, decoded.data());
      for (int64_t c = 0; c < in; ++c) row[c] = decoded[c];
    } else {
      for (int64_t c = 0; c < in; ++c) row[c] = quant_element(*W.quant, o, c);
    }
    for (int64_t t = 0; t < T; ++t) {
      double acc = b[o];
      for (int64_t c = 0; c < in; ++c) acc += double(x[t * in + c]) * row[c];
      y[t * out + o] = float(acc);
    }
  }
}

void linear_mxfp4(const float* x, int64_t T, const Weight& W, const std::vector<float>& b, float* y) {
  const int64_t in = W.in(), out = W.out();
  std::vector<double> row(in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t c = 0; c < in; ++c) row[c] = mxfp4_element(*W.w, *W.scales, o, c);
    for (int64_t t = 0; t < T; ++t) {
      double acc = b[o];
      for (int64_t c = 0; c < in; ++c) acc += double(x[t * in + c]) * row[c];
      y[t * out + o] = float(acc);
    }
  }
}

}  // namespace

void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y) {
  const int64_t in = W.in(), out = W.out();
  std::vector<float> rounded;
  if (kernels::runs_bf16_dot(W)) {  // the bf16 dot mode where it runs: x rounded to bf16, nearest even
    rounded.resize(size_t(T * in));
    for (int64_t i = 0; i < T * in; ++i) rounded[size_t(i)] = bf16_to_f32(f32_to_bf16(x[i]));
    x = rounded.data();
  }
  if (W.mxfp4() || W.quant) {
    std::vector<float> b(out, 0.0f);
    if (bias) widen_row(*bias, 0, out, b.data());
    if (W.quant) linear_quant(x, T, W, b, y);
    else linear_mxfp4(x, T, W, b, y);
    return;
  }
  std::vector<float> w_row(W.w->numel());
  widen_row(*W.w, 0, W.w->numel(), w_row.data());
  std::vector<float> b(out, 0.0f);
  if (bias) widen_row(*bias, 0, out, b.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < in; ++i) {
        const float w = W.layout == Layout::OutIn ? w_row[o * in + i] : w_row[i * out + o];
        acc += double(x[t * in + i]) * double(w);
      }
      y[t * out + o] = float(acc);
    }
}

}  // namespace lineage::kernels::ref
