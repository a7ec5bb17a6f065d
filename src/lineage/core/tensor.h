// Room core/: what every other room stands on and nothing of the models: Tensor and its dtypes
// (f32, f16, bf16, MXFP4 bytes), lineage::Error and LINEAGE_CHECK, the thread pool (parallel_for),
// hashing, seeded random numbers, checked arithmetic on sizes from files, scratch buffers, and JSON
// reading with a nesting limit (json_read.h). It uses no other room.
//
// Tensor: shape + dtype + storage that is either owned (64-byte aligned) or borrowed from a
// mapping that a shared owner keeps alive. Dim order is PyTorch's, outermost first, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "lineage/core/dtype.h"

namespace lineage {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, Shape shape);  // uninitialized, 64-byte aligned
  static Tensor zeros(DType dtype, Shape shape);
  // Wraps memory someone else owns (an mmap'd checkpoint); `owner` keeps it alive.
  static Tensor borrow(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return defined_ ? size_t(numel()) * dtype_size(dtype_) : 0; }
  bool is_borrowed() const { return borrowed_; }

  const void* raw() const { return data_; }
  void* raw_mut() { return data_; }
  template <class T> T* data() { return static_cast<T*>(data_); }
  template <class T> const T* data() const { return static_cast<const T*>(data_); }

  Tensor clone() const;  // deep copy into owned memory (an undefined tensor stays undefined)
  // Same bytes under another shape with equal element count (no copy).
  Tensor reshaped(Shape shape) const;
  // Rows [r0, r1) along dim 0, sharing these bytes (no copy; keeps the storage alive).
  Tensor rows(int64_t r0, int64_t r1) const;

 private:
  DType dtype_ = DType::F32;
  Shape shape_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
  bool borrowed_ = false;
  bool defined_ = false;
};

// Widens any float tensor (F32/F16/BF16/F64) into an owned F32 tensor of the same shape.
Tensor to_f32(const Tensor& t);
// Narrows an F32 tensor to `dtype` (F32 returns a copy).
Tensor convert(const Tensor& t, DType dtype);
// The transpose of a 2-D tensor [r, c] as an owned [c, r] tensor of the same dtype.
Tensor transposed(const Tensor& t);

}  // namespace lineage
