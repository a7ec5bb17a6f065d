#include "lineage/kernels/linear.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstdint>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/core/scratch.h"
#include "lineage/kernels/blas_threads.h"
#include "lineage/kernels/x86/gemm.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {

namespace {

int dtype_index(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::BF16: return 2;
    default: LINEAGE_CHECK(false, "weights must be F32, F16 or BF16, got ", dtype_name(t));
  }
  return 0;
}

void add_bias(const Tensor* bias, int64_t T, int64_t out, float* y) {
  if (!bias) return;
  thread_local std::vector<float> b;
  b.resize(out);
  widen_row(*bias, 0, out, b.data());
  const float* bp = b.data();
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t o = 0; o < out; ++o) y[t * out + o] += bp[o];
  }, grain_for(out));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// GEMV output rows (or columns) are handed out in chunks of whole 128s, so every chunk streams whole
// cache lines and the [in, out] kernel keeps full 8-vector column blocks.
int64_t gemv_chunk(int64_t in) { return (std::max<int64_t>(128, grain_for(in)) + 127) / 128 * 128; }

// Rows [o0, o1) of y = W·x: on the exact path (k), or for BF16 weights in the bf16 dot mode (dot
// not null) with x as the bf16 pairs xp.
void gemv_rows(const GemvTable& k, const GemvBf16Dot* dot, const float* x, const uint32_t* xp, const Weight& W,
               int64_t o0, int64_t o1, float* y) {
  if (dot) {
    const auto* w = static_cast<const uint16_t*>(W.w->raw());
    if (W.layout == Layout::OutIn) dot->out_in(xp, w, W.in(), o0, o1, y);
    else dot->in_out(xp, w, W.in(), W.out(), o0, o1, y);
    return;
  }
  const int dt = dtype_index(W.w->dtype());
  if (W.layout == Layout::OutIn) k.out_in[dt](x, W.w->raw(), W.in(), o0, o1, y);
  else k.in_out[dt](x, W.w->raw(), W.in(), W.out(), o0, o1, y);
}

std::atomic<Bf16WeightGemm> g_bf16_weight_gemm{Bf16WeightGemm::Exact};

// The GEMM this CPU and setting call for, or null for OpenBLAS.
const GemmPath* own_gemm(DType weights) {
  const GemmTable& t = gemm_table();
  if (weights == DType::BF16 && t.bf16_dot && bf16_weight_gemm() == Bf16WeightGemm::RoundActivationsToBf16)
    return t.bf16_dot;
  return t.exact;
}

// The GEMVs of several weights on one input, in one parallel region: every output is cut into
// chunks (gemv_chunk), and the chunks of all outputs, in order, into one near-equal share per thread
// (parallel_shares: a thread streams its share front to back, then helps with the others' from their
// back ends). The last kTailChunksPerThread chunks of each share are cut in quarters where the weight
// is [out, in] (a chunk is then one contiguous block, and a quarter of it streams as well), so the
// threads finish within a quarter chunk of each other. [in, out] chunks stay whole: a narrower column
// block walks the rows with a fraction of a cache line's worth of bytes per row and slowed GPT-2
// decode by 12 %. BF16 weights in the bf16 dot mode read x rounded to bf16 pairs by the bf16 GEMM's
// own `prepare` (once for the group), so one token decoded gives what the same token gives inside a
// prefill.
constexpr int64_t kTailChunksPerThread = 2;
void gemv_group(const float* x, std::span<const LinearOut> outs) {
  const GemvTable& k = gemv_table();
  const GemmPath* dot_path = gemm_table().bf16_dot;
  const GemvBf16Dot* dot = gemv_bf16_dot();
  thread_local std::vector<char> prepared;
  const uint32_t* xp = nullptr;
  auto rounded = [&](const LinearOut& o) { return dot && dot_path && own_gemm(o.W.w->dtype()) == dot_path; };
  for (const LinearOut& o : outs) {
    LINEAGE_CHECK(o.W.in() == outs[0].W.in(), "linear_group: weights of different input sizes");
    if (xp || !rounded(o)) continue;
    const int64_t in = o.W.in();
    auto* buf = static_cast<uint32_t*>(aligned_scratch(prepared, dot_path->prepared_bytes(1, in)));
    dot_path->prepare(GemmProblem{x, o.W.w->raw(), 2, o.W.layout == Layout::OutIn, 1, in, o.W.out(), o.y}, 0, 1, buf);
    xp = buf;
  }
  thread_local std::vector<std::array<int64_t, 3>> units;  // (output, o0, o1)
  thread_local std::vector<int64_t> starts;
  units.clear();
  starts.clear();
  int64_t total = 0;
  for (const LinearOut& o : outs) total += ceil_div(o.W.out(), gemv_chunk(o.W.in()));
  const int64_t parts = parts_for(total);
  int64_t index = 0, share = 0;  // the chunk's index and its share
  for (size_t j = 0; j < outs.size(); ++j) {
    const int64_t out = outs[j].W.out(), chunk = gemv_chunk(outs[j].W.in());
    const bool rows = outs[j].W.layout == Layout::OutIn;
    for (int64_t o0 = 0; o0 < out; o0 += chunk, ++index) {
      while (share < parts && index == total * share / parts) {
        starts.push_back(int64_t(units.size()));
        ++share;
      }
      const bool tail = index >= total * share / parts - kTailChunksPerThread;
      const int64_t o1 = std::min(out, o0 + chunk), piece = rows && tail ? chunk / 4 : chunk;
      for (int64_t p0 = o0; p0 < o1; p0 += piece) units.push_back({int64_t(j), p0, std::min(o1, p0 + piece)});
    }
  }
  starts.push_back(int64_t(units.size()));
  const auto* u = units.data();  // a thread_local named inside the lambda would be the worker's own
  parallel_shares(starts, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const LinearOut& o = outs[size_t(u[i][0])];
      gemv_rows(k, rounded(o) ? dot : nullptr, x, xp, o.W, u[i][1], u[i][2], o.y);
    }
  });
}

// Where this ISA has no own GEMM (AVX2, scalar), OpenBLAS, single-threaded (blas_threads.h) inside
// the engine's own threads.
// f32 weights: one sgemm a thread, each on its contiguous range of output columns of the stored matrix.
void gemm_f32(const float* x, int64_t T, const Weight& W, float* y) {
  const int64_t in = W.in(), out = W.out();
  const float* w = W.w->data<float>();
  constexpr int64_t kPanel = 64;
  parallel_for(ceil_div(out, kPanel), [&](int64_t p0, int64_t p1) {
    single_threaded_blas();
    const int64_t o0 = p0 * kPanel, n = std::min(out, p1 * kPanel) - o0;
    if (W.layout == Layout::OutIn)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, in, 1.0f, x, in, w + o0 * in, in, 0.0f, y + o0, out);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, n, in, 1.0f, x, in, w + o0, out, 0.0f, y + o0, out);
  }, grain_for(kPanel * in * T));
}

// f16 / bf16 weights: widen a panel of output columns at a time into per-thread scratch and sgemm
// it, so the f32 copy never exceeds a panel.
void gemm_widened(const float* x, int64_t T, const Weight& W, float* y) {
  const GemvTable& k = gemv_table();
  const int dt = dtype_index(W.w->dtype());
  const int64_t in = W.in(), out = W.out();
  constexpr int64_t kPanel = 128;
  const int64_t panels = (out + kPanel - 1) / kPanel;
  const auto* w = static_cast<const uint16_t*>(W.w->raw());
  parallel_for(panels, [&](int64_t p0, int64_t p1) {
    single_threaded_blas();
    thread_local std::vector<float> buf;
    buf.resize(size_t(kPanel) * in);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o0 = p * kPanel, n = std::min(kPanel, out - o0);
      if (W.layout == Layout::OutIn) {
        k.widen[dt](w + o0 * in, n * in, buf.data());
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, in, 1.0f, x, in, buf.data(), in, 0.0f,
                    y + o0, out);
      } else {
        for (int64_t i = 0; i < in; ++i) k.widen[dt](w + i * out + o0, n, buf.data() + i * n);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, n, in, 1.0f, x, in, buf.data(), n, 0.0f,
                    y + o0, out);
      }
    }
  }, grain_for(kPanel * in * T));
}

// Our own blocked GEMM (x86/gemm*.cpp). Columns are cut into whole nr-wide panels, in a number of
// blocks that is a multiple of the thread count (each block packs only its own weights; each thread
// starts on its own share of the blocks and helps with the others' when done, parallel_chunks);
// with fewer panels than threads, rows are split too. Every y element
// is computed by one fixed-order reduction, so results do not depend on the split or the thread
// count.
// At least kBlocksPerThread blocks per thread where there are panels for them, even when fewer
// blocks of nc_max columns would cover the output: GPT-2's 768-column GEMMs (attention and MLP
// c_proj) had 4 blocks at 2 threads, so a thread that lost its core for a moment left the other
// idle for up to a quarter of the GEMM (bf16 --bf16-dot pp512: median +5 % over 30 repetitions
// alternating in one process; the best repetitions unchanged, f32 within the noise).
constexpr int64_t kBlocksPerThread = 6;
void gemm_blocked(const GemmPath& path, const GemmProblem& p) {
  if (p.in == 0) {
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t o = 0; o < p.out; ++o) p.y[t * p.out + o] = p.bias ? p.bias[o] : 0.0f;
    if (p.gelu) activate(Activation::GeluTanh, p.y, p.T * p.out);
    return;
  }
  thread_local std::vector<char> prepared_buf;
  void* prepared = nullptr;
  if (path.prepare) {
    prepared = aligned_scratch(prepared_buf, path.prepared_bytes(p.T, p.in));
    parallel_for(p.T, [&](int64_t t0, int64_t t1) { path.prepare(p, t0, t1, prepared); }, grain_for(p.in));
  }
  const int64_t threads = num_threads(), panels = ceil_div(p.out, path.nr);
  const int64_t covering = ceil_div(ceil_div(panels * path.nr, path.nc_max), threads) * threads;
  const int64_t col_blocks = std::min(panels, std::max(kBlocksPerThread * threads, covering));
  constexpr int64_t kRowUnit = 8;  // whole register tiles per row block
  const int64_t row_units = ceil_div(p.T, kRowUnit);
  const int64_t row_blocks = col_blocks >= threads ? 1 : std::min(row_units, ceil_div(threads, col_blocks));
  const int64_t tasks = col_blocks * row_blocks;
  const int64_t grain = grain_for(p.T * p.in * p.out / tasks);
  parallel_chunks(tasks, grain, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<char> buf;
    void* scratch = aligned_scratch(buf, path.scratch_bytes);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t cb = b / row_blocks, rb = b % row_blocks;
      const int64_t o0 = panels * cb / col_blocks * path.nr, o1 = std::min(p.out, panels * (cb + 1) / col_blocks * path.nr);
      const int64_t t0 = row_units * rb / row_blocks * kRowUnit, t1 = std::min(p.T, row_units * (rb + 1) / row_blocks * kRowUnit);
      path.block(p, prepared, t0, t1, o0, o1, scratch);
    }
  });
}

}  // namespace

void set_bf16_weight_gemm(Bf16WeightGemm mode) { g_bf16_weight_gemm.store(mode); }
Bf16WeightGemm bf16_weight_gemm() { return g_bf16_weight_gemm.load(); }

bool use_bf16_dot_products(bool on) {
  const bool can = gemm_table().bf16_dot != nullptr;
  set_bf16_weight_gemm(on && can ? Bf16WeightGemm::RoundActivationsToBf16 : Bf16WeightGemm::Exact);
  return on && can;
}

void widen_row(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  if (t.dtype() == DType::F64) {
    for (int64_t i = 0; i < n; ++i) dst[i] = float(t.data<double>()[offset + i]);
    return;
  }
  const int dt = dtype_index(t.dtype());
  gemv_table().widen[dt](static_cast<const char*>(t.raw()) + offset * dtype_size(t.dtype()), n, dst);
}

void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y, std::optional<Activation> act) {
  LINEAGE_CHECK(W.w && W.w->ndim() == 2, "linear needs a 2-D weight");
  if (T <= 0) return;
  const GemmPath* own = own_gemm(W.w->dtype());
  if (T > 1 && own) {  // adds the bias (and GELU) as it stores y
    const float* b = nullptr;
    thread_local std::vector<float> widened;
    if (bias) {
      widened.resize(W.out());
      widen_row(*bias, 0, W.out(), widened.data());
      b = widened.data();
    }
    GemmProblem p{x, W.w->raw(), dtype_index(W.w->dtype()), W.layout == Layout::OutIn, T, W.in(), W.out(), y, b};
    p.gelu = act == Activation::GeluTanh;
    gemm_blocked(*own, p);
    if (act && !p.gelu) activate(*act, y, T * W.out());
    return;
  }
  if (T == 1) {
    const LinearOut one{W, nullptr, y};
    gemv_group(x, {&one, 1});
  } else if (W.w->dtype() == DType::F32) {
    gemm_f32(x, T, W, y);
  } else {
    gemm_widened(x, T, W, y);
  }
  add_bias(bias, T, W.out(), y);
  if (act) activate(*act, y, T * W.out());
}

void linear_group(const float* x, int64_t T, std::span<const LinearOut> outs) {
  for (const LinearOut& o : outs) LINEAGE_CHECK(o.W.w && o.W.w->ndim() == 2, "linear needs a 2-D weight");
  if (T != 1) {  // GEMMs are one region each anyway
    for (const LinearOut& o : outs) linear(x, T, o.W, o.bias, o.y);
    return;
  }
  gemv_group(x, outs);
  for (const LinearOut& o : outs) add_bias(o.bias, 1, o.W.out(), o.y);
}

}  // namespace lineage::kernels
