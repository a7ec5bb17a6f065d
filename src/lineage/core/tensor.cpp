#include "lineage/core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "lineage/core/checked.h"
#include "lineage/core/error.h"

namespace lineage {

std::optional<int64_t> checked_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    const auto m = checked_mul(n, d);
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

std::optional<int64_t> checked_nbytes(const Shape& s, DType t) {
  const auto n = checked_numel(s);
  return n ? checked_mul(*n, int64_t(dtype_size(t))) : std::nullopt;
}

// Shapes from outside are checked where they enter (checked_numel); one that overflows here is a bug.
int64_t shape_numel(const Shape& s) {
  const auto n = checked_numel(s);
  LINEAGE_CHECK(n, "element count of ", shape_str(s), " is negative or overflows int64");
  return *n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}  // namespace

Tensor Tensor::empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  const auto exact = checked_nbytes(t.shape_, dtype);
  LINEAGE_CHECK(exact && *exact <= INT64_MAX - 63, "byte length of ", shape_str(t.shape_), " overflows");
  const size_t bytes = size_t(*exact + 63) / 64 * 64;
  void* p = nullptr;
  if (bytes >= kHugePage) {
    // Large buffers (weights, KV caches, states) start on a 2 MiB boundary and ask for transparent
    // huge pages: a streaming read then crosses no 4 KiB page boundary, where the hardware
    // prefetchers stop and the TLB misses, every 4 KiB.
    if (posix_memalign(&p, kHugePage, bytes) != 0) p = nullptr;
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  } else if (bytes) {
    p = std::aligned_alloc(64, bytes);
  }
  if (bytes && !p) throw Error(cat("out of memory allocating ", bytes, " bytes for a tensor of shape ", shape_str(t.shape_)));
  t.data_ = p;
  t.defined_ = true;
  t.owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  if (t.nbytes()) std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::borrow(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = const_cast<void*>(data);
  t.owner_ = std::move(owner);
  t.borrowed_ = true;
  t.defined_ = true;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined_) return Tensor();
  Tensor t = empty(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  LINEAGE_CHECK(shape_numel(shape) == numel(), "reshape ", shape_str(shape_), " -> ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t r0, int64_t r1) const {
  LINEAGE_CHECK(defined_ && ndim() >= 1 && 0 <= r0 && r0 <= r1 && r1 <= dim(0), "rows [", r0, ", ", r1, ") of ",
                shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = r1 - r0;
  t.data_ = static_cast<char*>(data_) + size_t(r0) * (size_t(numel() / std::max<int64_t>(1, dim(0)))) * dtype_size(dtype_);
  return t;
}

Tensor to_f32(const Tensor& t) {
  Tensor out = Tensor::empty(DType::F32, t.shape());
  float* o = out.data<float>();
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32: std::memcpy(o, t.raw(), n * 4); break;
    case DType::F64: for (int64_t i = 0; i < n; ++i) o[i] = float(t.data<double>()[i]); break;
    case DType::BF16: for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(t.data<uint16_t>()[i]); break;
    case DType::F16: for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(t.data<uint16_t>()[i]); break;
    default: LINEAGE_CHECK(false, "to_f32 of non-float dtype ", dtype_name(t.dtype()));
  }
  return out;
}

namespace {
// d[c, r] = s[r, c] in square blocks, so the rows read and the rows written stay in cache meanwhile.
template <class E>
void transpose_as(const void* src, int64_t rows, int64_t cols, void* dst) {
  const E* s = static_cast<const E*>(src);
  E* d = static_cast<E*>(dst);
  constexpr int64_t kBlock = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock)
      for (int64_t c = c0; c < std::min(cols, c0 + kBlock); ++c)
        for (int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r) d[c * rows + r] = s[r * cols + c];
}
}  // namespace

Tensor transposed(const Tensor& t) {
  LINEAGE_CHECK(t.ndim() == 2, "transposed expects a 2-D tensor, got ", t.ndim(), " dims");
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty(t.dtype(), {cols, rows});
  switch (dtype_size(t.dtype())) {
    case 1: transpose_as<uint8_t>(t.raw(), rows, cols, out.raw_mut()); break;
    case 2: transpose_as<uint16_t>(t.raw(), rows, cols, out.raw_mut()); break;
    case 4: transpose_as<uint32_t>(t.raw(), rows, cols, out.raw_mut()); break;
    case 8: transpose_as<uint64_t>(t.raw(), rows, cols, out.raw_mut()); break;
    default: LINEAGE_CHECK(false, "transposed: elements of ", dtype_size(t.dtype()), " bytes");
  }
  return out;
}

Tensor convert(const Tensor& t, DType dtype) {
  LINEAGE_CHECK(t.dtype() == DType::F32, "convert expects F32, got ", dtype_name(t.dtype()));
  if (dtype == DType::F32) return t.clone();
  Tensor out = Tensor::empty(dtype, t.shape());
  const float* s = t.data<float>();
  uint16_t* o = out.data<uint16_t>();
  const int64_t n = t.numel();
  if (dtype == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(s[i]);
  } else {
    LINEAGE_CHECK(dtype == DType::F16, "convert to ", dtype_name(dtype));
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_f16(s[i]);
  }
  return out;
}

}  // namespace lineage
