// Quantized matrices as checkpoints store them (StoredQuant, matrix.h) turned into the kernels' view
// (QuantWeight, linear.h): the codes reinterpreted as bytes in place, the scales and zero points as
// small f32 tables.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tensor's elements widened to f32 (floats, F8_E4M3, integers).
float element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::F16: return f16_to_f32(t.data<uint16_t>()[i]);
    case DType::BF16: return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::F8_E4M3: return e4m3_to_f32(t.data<uint8_t>()[i]);
    case DType::F64: return float(t.data<double>()[i]);
    case DType::I64: return float(t.data<int64_t>()[i]);
    case DType::I32: return float(t.data<int32_t>()[i]);
    default: return std::nanf("");
  }
}

struct Where {
  const std::string& name;  // "….weight"
  const StoredQuant& q;
  [[noreturn]] void fail(const std::string& tensor, const std::string& what) const {
    throw Error(cat("tensor \"", tensor, "\": ", what, " (", q.origin, ")"));
  }
  void dtype(const std::string& tensor, const Tensor& t, std::initializer_list<DType> ok) const {
    std::string names;
    for (DType d : ok) {
      if (t.dtype() == d) return;
      names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
    }
    fail(tensor, cat("dtype ", dtype_name(t.dtype()), ", expected ", names));
  }
};

// A view of `t`'s bytes as U8 [rows, row_bytes], sharing its storage.
Tensor byte_view(const Tensor& t, int64_t rows, int64_t row_bytes) {
  auto keep = std::make_shared<Tensor>(t);
  return Tensor::borrow(DType::U8, {rows, row_bytes}, t.raw(), std::shared_ptr<const void>(keep, keep->raw()));
}

// scale_table[o, g] = f(scale of row o, group g) for a per-row/per-group scale tensor or a block one.
void fill_scales(Matrix& W, const Where& at, const std::string& tensor, int64_t group, int64_t block_rows,
                 int64_t block_cols) {
  const int64_t groups = ceil_div(W.in, group);
  W.qw.group = group, W.qw.groups = groups;
  W.scale_table = Tensor::empty(DType::F32, {W.out, groups});
  float* s = W.scale_table.data<float>();
  const int64_t cols = W.scales.ndim() == 2 ? W.scales.dim(1) : 1;
  // A block scale bound with one row per matrix row (a part of a tensor lineage splits by rows,
  // io/load_model.cpp); where that is also one row per block the two readings agree.
  if (block_rows > 0 && W.scales.ndim() == 2 && W.scales.dim(0) == W.out) block_rows = 1;
  for (int64_t o = 0; o < W.out; ++o)
    for (int64_t g = 0; g < groups; ++g) {
      int64_t i = 0;
      if (block_rows < 0) i = 0;
      else if (block_rows == 0) i = o * cols + (cols == 1 ? 0 : g);
      else i = (o / block_rows) * cols + (g * group) / block_cols;
      const float v = element(W.scales, i);
      if (!std::isfinite(v))
        at.fail(tensor, cat("scale ", v, " at element ", i, " (row ", o, ", columns from ", g * group,
                            ") is not finite; every scale must be a finite number"));
      s[o * groups + g] = v;
    }
}

void prepare_packed_int(Matrix& W, const Where& at) {
  const StoredQuant& q = W.quant;
  const std::string& n = at.name;
  at.dtype(n + "_packed", W.data, {DType::I32});
  at.dtype(n + "_scale", W.scales, {DType::F32, DType::F16, DType::BF16});
  const int64_t group = q.group ? q.group : W.in;
  at.dtype(n + "_shape", W.weight_shape, {DType::I64, DType::I32});
  if (int64_t(element(W.weight_shape, 0)) != W.out || int64_t(element(W.weight_shape, 1)) != W.in)
    at.fail(n + "_shape", cat("holds (", int64_t(element(W.weight_shape, 0)), ", ", int64_t(element(W.weight_shape, 1)),
                              "), expected (", W.out, ", ", W.in, ")"));
  fill_scales(W, at, n + "_scale", group, 0, group);
  W.codes = byte_view(W.data, W.out, W.in * q.bits / 8);
  if (q.symmetric) return;
  at.dtype(n + "_zero_point", W.zero_point, {DType::I32});
  const int64_t groups = ceil_div(W.in, group);
  W.zero_table = Tensor::empty(DType::F32, {W.out, groups});
  const auto* words = W.zero_point.data<int32_t>();
  const int64_t offset = int64_t(1) << (q.bits - 1), mask = (int64_t(1) << q.bits) - 1;
  for (int64_t o = 0; o < W.out; ++o)
    for (int64_t g = 0; g < groups; ++g) {
      // Packed along rows: row o's zero point of group g at bit (o·bits) % 32 of word (o·bits) / 32.
      const int64_t bit = o * q.bits;
      const uint32_t word = uint32_t(words[(bit / 32) * groups + g]);
      W.zero_table.data<float>()[o * groups + g] = float(int64_t((word >> (bit % 32)) & mask) - offset);
    }
}

void prepare_fp8(Matrix& W, const Where& at, const std::string& scale_name) {
  const StoredQuant& q = W.quant;
  at.dtype(at.name, W.data, {DType::F8_E4M3});
  at.dtype(scale_name, W.scales, {DType::F32, DType::F16, DType::BF16});
  const int64_t group = q.block_rows > 0 && q.block_cols < W.in ? q.block_cols : W.in;
  fill_scales(W, at, scale_name, group, q.block_rows, q.block_rows > 0 ? q.block_cols : W.in);
  W.codes = byte_view(W.data, W.out, W.in);
}

void prepare_nvfp4(Matrix& W, const Where& at) {
  const std::string& n = at.name;
  at.dtype(n + "_packed", W.data, {DType::U8});
  at.dtype(n + "_scale", W.scales, {DType::F8_E4M3});
  at.dtype(n + "_global_scale", W.global_scale, {DType::F32, DType::F16, DType::BF16});
  const float global = element(W.global_scale, 0);
  if (!std::isfinite(global) || global <= 0.0f)
    at.fail(n + "_global_scale", cat("is ", global, ", expected a finite positive number (it divides every block scale)"));
  fill_scales(W, at, n + "_scale", 16, 0, 16);
  // e2m1 · (scale / global): the quotient first, in f32, as compressed-tensors computes it.
  float* s = W.scale_table.data<float>();
  for (int64_t i = 0; i < W.scale_table.numel(); ++i) s[i] = s[i] / global;
  W.codes = byte_view(W.data, W.out, W.in / 2);
}

// ggml's blocks: the stored rows as they are (U8 [out, row bytes]).
void prepare_ggml(Matrix& W, const Where& at) {
  const GgmlBlockInfo& b = ggml_block_info(W.quant.ggml);
  at.dtype(at.name, W.data, {DType::U8});
  if (W.in % b.values)
    at.fail(at.name, cat(b.name, " rows of ", W.in, " values; the format stores whole blocks of ", b.values));
  const int64_t row_bytes = W.in / b.values * b.bytes;
  if (W.data.ndim() != 2 || W.data.dim(0) != W.out || W.data.dim(1) != row_bytes)
    at.fail(at.name, cat(b.name, " data ", shape_str(W.data.shape()), ", expected [", W.out, ", ", row_bytes, "]"));
  W.codes = W.data;
  QuantWeight& v = W.qw;
  v.codes = QuantCodes::Ggml;
  v.ggml = W.quant.ggml;
  v.q = static_cast<const uint8_t*>(W.data.raw());
  v.scale = v.zero = nullptr;
  v.in = W.in, v.out = W.out;
  v.group = b.values, v.groups = W.in / b.values;
  v.row_bytes = row_bytes;
}

}  // namespace

void prepare_quant(Matrix& W, const std::string& name) {
  using Kind = StoredQuant::Kind;
  const StoredQuant& q = W.quant;
  const Where at{name, q};
  if (q.kind == Kind::Ggml) return prepare_ggml(W, at);
  const bool nibbles = (q.kind == Kind::PackedInt && q.bits == 4) || q.kind == Kind::Nvfp4;
  const int64_t whole = nibbles ? 32 : 16;
  if (W.in % whole)
    at.fail(name, cat("rows of ", W.in, " columns; lineage's quantized kernels take rows of whole ", whole,
                      "-column runs"));
  const int64_t group = q.kind == Kind::PackedInt && q.group ? q.group : 0;
  if (group && group % 16 && group != W.in)
    at.fail(name + "_scale", cat("group_size ", group, ": lineage's kernels take groups of a multiple of 16 columns"));
  if ((q.kind == Kind::Fp8 || q.kind == Kind::HfFp8) && q.block_rows > 0 && q.block_cols < W.in && q.block_cols % 16)
    at.fail(name, cat("blocks of ", q.block_cols, " columns: lineage's kernels take a multiple of 16"));
  switch (q.kind) {
    case Kind::PackedInt: prepare_packed_int(W, at); break;
    case Kind::Fp8: prepare_fp8(W, at, name + "_scale"); break;
    case Kind::HfFp8: prepare_fp8(W, at, name + "_scale_inv"); break;
    case Kind::Nvfp4: prepare_nvfp4(W, at); break;
    case Kind::Ggml:
    case Kind::None: return;
  }
  QuantWeight& v = W.qw;
  v.codes = q.kind == Kind::PackedInt ? (q.bits == 4 ? QuantCodes::Int4 : QuantCodes::Int8)
            : q.kind == Kind::Nvfp4   ? QuantCodes::Fp4
                                      : QuantCodes::Fp8;
  v.q = static_cast<const uint8_t*>(W.codes.raw());
  v.scale = W.scale_table.data<float>();
  v.zero = W.zero_table.defined() ? W.zero_table.data<float>() : nullptr;
  v.in = W.in, v.out = W.out;
  v.row_bytes = W.codes.dim(1);
}

void decode_rows(const Matrix& W, int64_t o0, int64_t o1, float* dst) {
  if (W.quant.kind == StoredQuant::Kind::Ggml && W.qw.q) {  // blocks decode in column order, in place
    for (int64_t o = o0; o < o1; ++o) ref::ggml_decode_row(W.qw.ggml, W.qw.q + o * W.qw.row_bytes, W.in, dst + (o - o0) * W.in);
    return;
  }
  const bool mxfp4 = W.packed && !W.quant.defined();
  LINEAGE_CHECK((W.quant.defined() && W.qw.q) || mxfp4, "decode_rows: a prepared quantized or MXFP4 matrix");
  const GemvTable& k = gemv_table();
  const int64_t in = W.in, ld = mxfp4 ? k.mxfp4.stride(in) : in;
  // Where each column sits in the kernels' order: `prepare` applied to the column numbers from 1 (the
  // zero padding of MXFP4's order then reads 0).
  std::vector<float> index(static_cast<size_t>(in)), order(static_cast<size_t>(ld)), row(order.size());
  for (int64_t c = 0; c < in; ++c) index[size_t(c)] = float(c + 1);
  if (mxfp4) k.mxfp4.prepare(index.data(), in, order.data());
  else k.quant.prepare(W.qw, index.data(), order.data());
  const auto* codes = static_cast<const uint8_t*>(W.data.raw());
  const auto* scales = static_cast<const uint8_t*>(W.scales.raw());
  for (int64_t o = o0; o < o1; ++o) {
    if (mxfp4) k.mxfp4.decode(codes, scales, in, o, o + 1, row.data());
    else k.quant.decode(W.qw, o, o + 1, row.data());
    for (int64_t j = 0; j < ld; ++j)
      if (order[size_t(j)] > 0) dst[(o - o0) * in + int64_t(order[size_t(j)]) - 1] = row[size_t(j)];
  }
}

Matrix quant_rows(const Matrix& W, int64_t r0, int64_t r1) {
  LINEAGE_CHECK(r0 >= 0 && r0 <= r1 && r1 <= W.out, "quant_rows: rows ", r0, "..", r1, " of ", W.out);
  Matrix m;
  m.layout = Layout::OutIn, m.out = r1 - r0, m.in = W.in;
  if (W.packed && !W.quant.defined()) {  // MXFP4: views of its codes' and exponents' rows
    m.packed = true;
    m.data = W.data.rows(r0, r1);
    m.scales = W.scales.rows(r0, r1);
    return m;
  }
  LINEAGE_CHECK(W.quant.defined() && W.qw.q, "quant_rows: a prepared quantized or MXFP4 matrix");
  m.quant = W.quant;
  m.codes = W.codes.rows(r0, r1);
  if (W.scale_table.defined()) m.scale_table = W.scale_table.rows(r0, r1);
  if (W.zero_table.defined()) m.zero_table = W.zero_table.rows(r0, r1);
  m.qw = W.qw;
  m.qw.out = m.out;
  m.qw.q = static_cast<const uint8_t*>(m.codes.raw());
  m.qw.scale = m.scale_table.defined() ? m.scale_table.data<float>() : nullptr;
  m.qw.zero = m.zero_table.defined() ? m.zero_table.data<float>() : nullptr;
  return m;
}

}  // namespace lineage::kernels
