// Room layers/: the building blocks that own a Config and Weights (and, for token mixers, a State):
// the token mixers of mixers/ (softmax attention, the delta-rule family, MLA), the channel mixers
// of ffn/ (MLP, gated MLP, MoE), norms and Block Attention Residuals. Each lists its tensors once
// in a visitor and runs a whole batched step (step.h). Uses kernels and core.
//
// What every building block shares: the tensor and matrix visitors, named activation buffers, and the
// trace hook that names intermediates so they can be diffed against the PyTorch reference (the step
// and the options of a call are in step.h).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <type_traits>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/tensor.h"
#include "lineage/kernels/matrix.h"
#include "lineage/layers/step.h"

namespace lineage::layers {

// How a preset fills a tensor with seeded random values (loading from a checkpoint ignores it).
enum class Init : uint8_t { Normal, Ones, Zeros, Custom };

// Visitor of every Weights::for_each_tensor: f(name, tensor, expected shape, init), names the
// checkpoint's own. Made from any such callable; `with_matrices` adds a second callable that
// visit_matrix calls with each weight matrix and its name ("….weight") before its tensors (to set how
// the checkpoint stores it, or to prepare it once bound).
class TensorVisitor {
 public:
  using Fn = std::function<void(const std::string& name, Tensor& t, const Shape& shape, Init init)>;
  using MatrixFn = std::function<void(const std::string& name, kernels::Matrix& m)>;
  template <class F>
    requires std::is_invocable_v<F&, const std::string&, Tensor&, const Shape&, Init>
  TensorVisitor(F f) : fn_(std::move(f)) {}  // NOLINT: implicit, as std::function is
  static TensorVisitor with_matrices(MatrixFn m, Fn f = [](const std::string&, Tensor&, const Shape&, Init) {}) {
    TensorVisitor v(std::move(f));
    v.matrix_ = std::move(m);
    return v;
  }
  void operator()(const std::string& name, Tensor& t, const Shape& shape, Init init) const { fn_(name, t, shape, init); }
  void matrix(const std::string& name, kernels::Matrix& m) const {
    if (matrix_) matrix_(name, m);
  }

 private:
  Fn fn_;
  MatrixFn matrix_;
};
// Visitor of every weight matrix of a layer (model::prepare transposes the [in, out] ones it owns).
using MatrixVisitor = std::function<void(kernels::Matrix& m)>;

// The stored tensors of a quantized matrix (StoredQuant, kernels/matrix.h) with their shapes.
void visit_quantized(const TensorVisitor& f, const std::string& name, kernels::Matrix& m);

// A weight matrix of logical shape [out, in] under its checkpoint name ("….weight"): sets the shape
// and visits its data with the shape its layout stores; a packed one as its pair, "….weight_packed"
// [out, in / 2] (two e2m1 values a byte) and "….weight_scale" [out, in / 32] (an E8M0 exponent per
// 32 values), both U8.
inline void visit_matrix(const TensorVisitor& f, const std::string& name, kernels::Matrix& m, int64_t out, int64_t in,
                         Init init = Init::Normal) {
  m.out = out, m.in = in;
  f.matrix(name, m);
  if (m.quant.defined()) {
    visit_quantized(f, name, m);
    return;
  }
  if (!m.packed) {
    f(name, m.data, kernels::stored_shape(m.layout, in, out), init);
    return;
  }
  if (in % 32)
    throw Error(cat(name, "_packed: an MXFP4 matrix needs rows of whole 32-value blocks (one scale each); this one's rows hold ",
                    in, " values"));
  f(name + "_packed", m.data, {out, in / 2}, init);
  f(name + "_scale", m.scales, {out, in / 32}, init);
}

// One growable f32 activation buffer, 64-byte aligned, so the kernels' vector loads of a row never
// straddle two cache lines. get(n) keeps the contents when it grows (zeroing the rest, as
// std::vector::resize would). Every growth is counted: once a workspace is warm, a step allocates
// nothing (the workspace test counts over 100 steps).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept : data_(std::move(o.data_)), size_(std::exchange(o.size_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::move(o.data_);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~Buffer() { release(); }
  float* get(size_t n) {
    if (size_ < n) grow(n);
    return data_.get();
  }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(float); }
  // Growths of any Buffer in this process so far.
  static int64_t growths() { return growths_.load(std::memory_order_relaxed); }
  // Bytes all Buffers of this process hold now (the steps' workspaces, as `bench` reports them).
  static int64_t live_bytes() { return live_.load(std::memory_order_relaxed); }

 private:
  void release() {
    live_.fetch_sub(int64_t(size_ * sizeof(float)), std::memory_order_relaxed);
    data_.reset();
    size_ = 0;
  }
  void grow(size_t n) {
    auto* p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
    if (!p) throw std::bad_alloc();
    if (size_) std::memcpy(p, data_.get(), size_ * sizeof(float));
    std::memset(p + size_, 0, (n - size_) * sizeof(float));
    data_.reset(p);
    live_.fetch_add(int64_t((n - size_) * sizeof(float)), std::memory_order_relaxed);
    size_ = n;
    growths_.fetch_add(1, std::memory_order_relaxed);
  }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t size_ = 0;
  static inline std::atomic<int64_t> growths_{0};
  static inline std::atomic<int64_t> live_{0};
};

// Named-intermediate hook: forward code calls trace("attn.qkv", data, {T, 3D}); the model adds the
// block prefix ("h3."). Empty by default and free when empty.
struct Trace {
  std::function<void(const std::string& name, const float* data, const Shape& shape)> fn;
  std::string prefix;
  bool on() const { return bool(fn); }
  // The shape as a braced list, made into a Shape only when a hook is set: a step with no trace
  // allocates nothing here.
  void operator()(std::string_view name, const float* data, std::initializer_list<int64_t> shape) const {
    if (fn) fn(prefix + std::string(name), data, Shape(shape));
  }
  Trace with_prefix(const std::string& p) const { return Trace{fn, prefix + p}; }
};

}  // namespace lineage::layers
