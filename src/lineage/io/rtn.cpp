#include "lineage/io/rtn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lineage/core/dtype.h"
#include "lineage/core/error.h"
#include "lineage/kernels/linear.h"

namespace lineage::io {

namespace {

constexpr double kE4m3Max = 448.0, kE4m3NanFrom = 464.0, kFp4Max = 6.0;
constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// v rounded to nearest even into dtype d (the result of one f32 operation on values of d, rounded
// again to d: how torch computes bf16 and f16 arithmetic), returned as a double.
double round_to(double v, DType d) {
  const float f = float(v);
  switch (d) {
    case DType::BF16: return double(bf16_to_f32(f32_to_bf16(f)));
    case DType::F16: return double(f16_to_f32(f32_to_f16(f)));
    default: return double(f);
  }
}
double f32(double v) { return double(float(v)); }

// torch.finfo(d).eps, what compressed-tensors puts in place of a zero scale; and the smallest normal.
double eps_of(DType d) { return d == DType::BF16 ? 0x1p-7 : d == DType::F16 ? 0x1p-10 : 0x1p-23; }
double tiny_of(DType d) { return d == DType::F16 ? 0x1p-14 : 0x1p-126; }
int emin_of(DType d) { return d == DType::F16 ? -14 : -126; }
double max_of(DType d) {
  return d == DType::BF16 ? double(bf16_to_f32(0x7f7f)) : d == DType::F16 ? 65504.0 : double(std::numeric_limits<float>::max());
}

// |x| rounded to nearest even onto a binary grid of p significand bits whose smallest normal is 2^emin.
double grid_round(double ax, int p, int emin) {
  if (ax == 0 || !std::isfinite(ax)) return ax;
  int e = 0;
  std::frexp(ax, &e);
  const double ulp = std::ldexp(1.0, std::max(e - 1, emin) - (p - 1));
  return std::nearbyint(ax / ulp) * ulp;
}

// compressed-tensors' round_to_power_2 on x ≥ 0 of dtype d (spec §6.2a): 2^E for x = s·2^E, or 2^(E+1)
// when s ≥ 1.75; below the smallest normal, that normal from 0.75 of it, else 0.
double pow2round(double x, DType d) {
  const double smallest = std::ldexp(1.0, emin_of(d));
  if (x < smallest) return x >= 0.75 * smallest ? smallest : 0.0;
  int e = 0;
  std::frexp(x, &e);
  const double power = std::ldexp(1.0, e - 1), r = x / power >= 1.75 ? 2 * power : power;
  return r > max_of(d) ? std::numeric_limits<double>::infinity() : r;
}

double element(const Tensor& W, int64_t i) {
  switch (W.dtype()) {
    case DType::F32: return double(W.data<float>()[i]);
    case DType::F16: return double(f16_to_f32(W.data<uint16_t>()[i]));
    default: return double(bf16_to_f32(W.data<uint16_t>()[i]));
  }
}

// max |W| over n consecutive elements from `at`.
double abs_max(const Tensor& W, int64_t at, int64_t n) {
  double a = 0;
  for (int64_t i = at; i < at + n; ++i) a = std::max(a, std::fabs(element(W, i)));
  return a;
}

void put(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::F32: t.data<float>()[i] = float(v); break;
    case DType::F16: t.data<uint16_t>()[i] = f32_to_f16(float(v)); break;
    default: t.data<uint16_t>()[i] = f32_to_bf16(float(v)); break;
  }
}

// Codes q [rows, cols] in [-2^(bits-1), 2^(bits-1)) packed as pack_to_int32 does: u = q + 2^(bits-1),
// element i at bit i·bits of the row's 32-bit words (4 and 8 bits never straddle a word).
Tensor pack_int32(const std::vector<int>& q, int64_t rows, int64_t cols, int bits) {
  const int64_t words = (cols * bits + 31) / 32;
  Tensor t = Tensor::zeros(DType::I32, {rows, words});
  auto* w = static_cast<uint32_t*>(t.raw_mut());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t u = uint32_t(q[size_t(r * cols + c)] + (1 << (bits - 1)));
      w[r * words + c * bits / 32] |= u << (c * bits % 32);
    }
  return t;
}

Tensor pack_nibbles(const std::vector<uint8_t>& codes, int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty(DType::U8, {rows, cols / 2});
  auto* b = t.data<uint8_t>();
  for (int64_t i = 0; i < rows * cols / 2; ++i) b[i] = uint8_t((codes[size_t(2 * i)] & 15) | (codes[size_t(2 * i + 1)] << 4));
  return t;
}

std::vector<std::pair<std::string, Tensor>> quantize_int(const Tensor& W, const RtnArgs& a) {
  const int bits = a.scheme == RtnScheme::W8A16 ? 8 : 4;
  const bool sym = a.scheme != RtnScheme::W4A16_ASYM;
  const int64_t rows = W.dim(0), cols = W.dim(1), group = a.group ? a.group : cols, groups = cols / group;
  const DType d = W.dtype();
  const double q_min = -double(1 << (bits - 1)), q_max = double((1 << (bits - 1)) - 1);
  Tensor scale = Tensor::empty(d, {rows, groups});
  std::vector<int> q(size_t(rows * cols)), zq(size_t(rows * groups), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = r * cols + g * group;
      double mn = 0, mx = 0;  // widened to include 0
      for (int64_t c = 0; c < group; ++c) mn = std::min(mn, element(W, c0 + c)), mx = std::max(mx, element(W, c0 + c));
      double s = 0, zp = 0;
      if (sym) {
        s = round_to(std::max(-mn, mx) / ((q_max - q_min) / 2), d);  // amax / 7.5 (int4), / 127.5 (int8)
      } else {
        s = round_to(round_to(mx - mn, d) / (q_max - q_min), d);
        zp = round_to(q_min - round_to(mn / s, d), d);  // 0 / 0 (an all-zero group): NaN, stored as 0
        zp = std::isnan(zp) ? 0.0 : std::nearbyint(std::clamp(zp, q_min, q_max));
      }
      if (s == 0) s = eps_of(d);  // after the zero point, as the reference
      put(scale, r * groups + g, s);
      zq[size_t(r * groups + g)] = int(zp);
      for (int64_t c = 0; c < group; ++c) {
        double t = round_to(element(W, c0 + c) / s, d);
        if (!sym) t = round_to(t + zp, d);
        q[size_t(c0 + c)] = int(std::clamp(std::nearbyint(t), q_min, q_max));
      }
    }
  Tensor shape = Tensor::empty(DType::I64, {2});
  shape.data<int64_t>()[0] = rows, shape.data<int64_t>()[1] = cols;
  std::vector<std::pair<std::string, Tensor>> out = {{"weight_packed", pack_int32(q, rows, cols, bits)},
                                                     {"weight_scale", scale}};
  if (!sym) {  // packed along rows: the transpose packed, transposed back
    std::vector<int> zt(zq.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) zt[size_t(g * rows + r)] = zq[size_t(r * groups + g)];
    const Tensor packed = pack_int32(zt, groups, rows, bits);
    const int64_t words = packed.dim(1);
    Tensor zp = Tensor::empty(DType::I32, {words, groups});
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t w = 0; w < words; ++w) zp.data<int32_t>()[w * groups + g] = packed.data<int32_t>()[g * words + w];
    out.push_back({"weight_zero_point", zp});
  }
  out.push_back({"weight_shape", shape});
  return out;
}

std::vector<std::pair<std::string, Tensor>> quantize_fp8_block(const Tensor& W) {
  constexpr int64_t kBlock = 128;
  const int64_t rows = W.dim(0), cols = W.dim(1), br = (rows + kBlock - 1) / kBlock, bc = (cols + kBlock - 1) / kBlock;
  const DType d = W.dtype();
  Tensor scale = Tensor::empty(d, {br, bc}), codes = Tensor::empty(DType::F8_E4M3, {rows, cols});
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r1 = std::min(rows, (i + 1) * kBlock), c1 = std::min(cols, (j + 1) * kBlock);
      double amax = 0;
      for (int64_t r = i * kBlock; r < r1; ++r)
        for (int64_t c = j * kBlock; c < c1; ++c) amax = std::max(amax, std::fabs(element(W, r * cols + c)));
      double s = round_to(amax / kE4m3Max, d);
      if (s == 0) s = eps_of(d);
      put(scale, i * bc + j, s);
      for (int64_t r = i * kBlock; r < r1; ++r)
        for (int64_t c = j * kBlock; c < c1; ++c)
          codes.data<uint8_t>()[r * cols + c] = e4m3_encode(std::clamp(round_to(element(W, r * cols + c) / s, d), -kE4m3Max, kE4m3Max));
    }
  return {{"weight", codes}, {"weight_scale", scale}};
}

std::vector<std::pair<std::string, Tensor>> quantize_mxfp4(const Tensor& W) {
  const int64_t rows = W.dim(0), cols = W.dim(1), groups = cols / 32;
  const DType d = W.dtype();
  Tensor scale = Tensor::empty(DType::U8, {rows, groups});
  std::vector<uint8_t> codes(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = r * cols + g * 32;
      const double p = pow2round(abs_max(W, c0, 32), d);
      // 127 + floor(log2 p) - 2 (2 = floor(log2 6)), clamped to a byte as the uint8 cast does
      const double e = p == 0 ? -std::numeric_limits<double>::infinity() : std::floor(std::log2(p));
      const int s = int(std::clamp(127.0 + e - 2.0, 0.0, 255.0));
      scale.data<uint8_t>()[r * groups + g] = uint8_t(s);
      const double sv = round_to(std::ldexp(1.0, s - 127), d);
      for (int64_t c = 0; c < 32; ++c)
        codes[size_t(c0 + c)] = e2m1_encode(std::clamp(round_to(element(W, c0 + c) / sv, d), -kFp4Max, kFp4Max));
    }
  return {{"weight_packed", pack_nibbles(codes, rows, cols)}, {"weight_scale", scale}};
}

// The e4m3 value nearest x (ties to even), NaN from 464 on.
double e4m3_value(double x) {
  if (std::fabs(x) >= kE4m3NanFrom) return std::nan("");
  return std::copysign(grid_round(std::fabs(x), 4, -6), x);
}

std::vector<std::pair<std::string, Tensor>> quantize_nvfp4(const Tensor& W, double fused_amax) {
  const int64_t rows = W.dim(0), cols = W.dim(1), groups = cols / 16;
  const DType d = W.dtype();
  const double amax = fused_amax > 0 ? fused_amax : rtn_amax(W);
  // generate_gparam: 2688 · reciprocal(max(amax, tiny)), both steps in the weights' dtype, stored as f32.
  double g = f32(round_to(448.0 * 6.0 * round_to(1.0 / std::max(amax, tiny_of(d)), d), d));
  if (!std::isfinite(g)) g = 1.0;
  Tensor scale = Tensor::empty(DType::F8_E4M3, {rows, groups}), global = Tensor::empty(DType::F32, {1});
  global.data<float>()[0] = float(g);
  std::vector<uint8_t> codes(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < groups; ++k) {
      const int64_t c0 = r * cols + k * 16;
      const double s0 = round_to(abs_max(W, c0, 16) / kFp4Max, d);
      double s = e4m3_value(std::clamp(f32(g * s0), -kE4m3Max, kE4m3Max));  // the product in f32 (g is [1] f32)
      if (s == 0) s = 0.125;  // FP8's eps
      scale.data<uint8_t>()[r * groups + k] = e4m3_encode(s);
      const double effective = f32(s / g);
      for (int64_t c = 0; c < 16; ++c)
        codes[size_t(c0 + c)] = e2m1_encode(std::clamp(f32(element(W, c0 + c) / effective), -kFp4Max, kFp4Max));
    }
  return {{"weight_packed", pack_nibbles(codes, rows, cols)}, {"weight_scale", scale}, {"weight_global_scale", global}};
}

}  // namespace

uint8_t e4m3_encode(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double r = std::fabs(e4m3_value(x));
  if (std::isnan(r)) return uint8_t(0x7f | sign);
  if (r == 0) return sign;
  int e = 0;
  std::frexp(r, &e);
  const int exponent = e - 1;
  if (exponent < -6) return uint8_t(sign | int(std::nearbyint(r / 0x1p-9)));
  const int mantissa = int(std::nearbyint(r / std::ldexp(1.0, exponent) * 8.0 - 8.0));
  return uint8_t(sign | ((exponent + 7) << 3) | mantissa);
}

uint8_t e2m1_encode(double x) {
  const double r = std::min(grid_round(std::fabs(x), 2, 0), kFp4Max);
  int index = 0;
  while (index < 7 && kE2m1[index] != r) ++index;
  return uint8_t(index | (x < 0 ? 8 : 0));
}

double rtn_amax(const Tensor& W) { return abs_max(W, 0, W.numel()); }

std::string rtn_unfit(const Shape& shape, DType dtype, const RtnArgs& a) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
    return cat("its dtype is ", dtype_name(dtype), ", not F32, F16 or BF16");
  if (shape.size() != 2) return cat("it is not a matrix (shape ", shape_str(shape), ")");
  const int64_t in = shape[1];
  const bool nibbles = a.scheme != RtnScheme::W8A16 && a.scheme != RtnScheme::FP8_BLOCK;
  if (in % (nibbles ? 32 : 16)) return cat("its rows hold ", in, " columns; lineage's ", nibbles ? "4" : "8", "-bit kernels take whole runs of ", nibbles ? 32 : 16);
  const bool int_scheme = a.scheme == RtnScheme::W4A16 || a.scheme == RtnScheme::W4A16_ASYM || a.scheme == RtnScheme::W8A16;
  if (int_scheme && a.group && in % a.group) return cat("its rows hold ", in, " columns, not whole groups of ", a.group);
  if ((a.scheme == RtnScheme::MXFP4 || a.scheme == RtnScheme::NVFP4) && dtype == DType::F16)
    return "FP4 schemes take BF16 or F32 weights (as llm-compressor)";
  return "";
}

std::vector<RtnPart> rtn_layout(const Shape& shape, DType dtype, const RtnArgs& a) {
  const int64_t rows = shape[0], cols = shape[1];
  switch (a.scheme) {
    case RtnScheme::W4A16:
    case RtnScheme::W4A16_ASYM:
    case RtnScheme::W8A16: {
      const int bits = a.scheme == RtnScheme::W8A16 ? 8 : 4;
      const int64_t groups = a.group ? cols / a.group : 1;
      std::vector<RtnPart> p = {{"weight_packed", DType::I32, {rows, (cols * bits + 31) / 32}},
                                {"weight_scale", dtype, {rows, groups}}};
      if (a.scheme == RtnScheme::W4A16_ASYM) p.push_back({"weight_zero_point", DType::I32, {(rows * bits + 31) / 32, groups}});
      p.push_back({"weight_shape", DType::I64, {2}});
      return p;
    }
    case RtnScheme::FP8_BLOCK:
      return {{"weight", DType::F8_E4M3, {rows, cols}}, {"weight_scale", dtype, {(rows + 127) / 128, (cols + 127) / 128}}};
    case RtnScheme::MXFP4: return {{"weight_packed", DType::U8, {rows, cols / 2}}, {"weight_scale", DType::U8, {rows, cols / 32}}};
    case RtnScheme::NVFP4:
      return {{"weight_packed", DType::U8, {rows, cols / 2}}, {"weight_scale", DType::F8_E4M3, {rows, cols / 16}},
              {"weight_global_scale", DType::F32, {1}}};
  }
  return {};
}

std::vector<std::pair<std::string, Tensor>> rtn_quantize(const Tensor& W, const RtnArgs& a) {
  const std::string unfit = rtn_unfit(W.shape(), W.dtype(), a);
  LINEAGE_CHECK(unfit.empty(), "rtn_quantize: ", unfit);
  switch (a.scheme) {
    case RtnScheme::W4A16:
    case RtnScheme::W4A16_ASYM:
    case RtnScheme::W8A16: return quantize_int(W, a);
    case RtnScheme::FP8_BLOCK: return quantize_fp8_block(W);
    case RtnScheme::MXFP4: return quantize_mxfp4(W);
    case RtnScheme::NVFP4: return quantize_nvfp4(W, a.nvfp4_amax);
  }
  return {};
}

}  // namespace lineage::io
