// What every building block shares: the tensor visitor's vocabulary, reusable scratch, and the
// trace hook that names intermediates so they can be diffed against the PyTorch reference.
#pragma once

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::layers {

// How a preset fills a tensor with seeded random values (loading from a checkpoint ignores it).
enum class Init : uint8_t { Normal, Ones, Zeros, Custom };

// Visitor signature of every Weights::for_each_tensor: f(name, tensor, expected shape, init).
// Names are the checkpoint's own, relative to the block's prefix.
using TensorVisitor = std::function<void(const std::string& name, Tensor& t, const Shape& shape, Init init)>;

// Growable f32 buffers reused across calls, so no step allocates once warmed up. Each starts on a
// cache line (64 bytes), so the kernels' vector loads of a row never straddle two lines; growing one
// keeps its contents and zeroes the rest, as std::vector::resize would.
class Scratch {
 public:
  float* get(int slot, size_t n) {
    if (slot >= int(bufs_.size())) bufs_.resize(size_t(slot) + 1);
    Buffer& b = bufs_[size_t(slot)];
    if (b.size < n) {
      auto* p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
      if (!p) throw std::bad_alloc();
      if (b.size) std::memcpy(p, b.data.get(), b.size * sizeof(float));
      std::memset(p + b.size, 0, (n - b.size) * sizeof(float));
      b.data.reset(p);
      b.size = n;
    }
    return b.data.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  struct Buffer {
    std::unique_ptr<float[], Free> data;
    size_t size = 0;
  };
  std::vector<Buffer> bufs_;
};

// Named-intermediate hook: forward code calls trace("attn.qkv", data, {T, 3D}); the model adds the
// block prefix ("h3."). Empty by default and free when empty.
struct Trace {
  std::function<void(const std::string& name, const float* data, const Shape& shape)> fn;
  std::string prefix;
  bool on() const { return bool(fn); }
  void operator()(std::string_view name, const float* data, const Shape& shape) const {
    if (fn) fn(prefix + std::string(name), data, shape);
  }
  Trace with_prefix(const std::string& p) const { return Trace{fn, prefix + p}; }
};

}  // namespace lineage::layers
