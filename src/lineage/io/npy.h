// NumPy .npy files (format 1.0/2.0/3.0, little-endian, C order): float32 and int32/int64 arrays.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::io {

void save_npy(const std::filesystem::path& path, const float* data, const Shape& shape);

// A float32 .npy of `shape` written in pieces (what save_npy writes at once): write() appends values
// in C order; close() checks that exactly the shape's count came.
class NpyWriter {
 public:
  NpyWriter(const std::filesystem::path& path, const Shape& shape);
  void write(const float* data, int64_t n);
  void close();

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  int64_t total_ = 0, written_ = 0;
};
// Reads <f4, <f8 (narrowed), <i4 or <i8 arrays into an owned tensor (F32 or I32/I64). Anything else
// (a damaged header, a shape whose byte length differs from the data's) is an Error naming the file.
Tensor load_npy(const std::filesystem::path& path);
// A float32 .npy mapped, not read: a borrowed view of its data (pages read as they are touched), for
// files larger than memory. Errors as load_npy's; another dtype is an Error.
Tensor map_npy_f32(const std::filesystem::path& path);

}  // namespace lineage::io
