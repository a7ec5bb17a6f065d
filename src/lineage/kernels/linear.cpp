// Linear maps over every stored dtype and layout: the one place that picks GEMV, rows GEMV or GEMM
// (over 400 lines, one concept: choosing the product for a call and splitting it over the threads).
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/core/scratch.h"
#include "lineage/kernels/blas_threads.h"
#include "lineage/kernels/row_split.h"
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

// An MXFP4 weight's contract (linear.h, matrix.h): U8 codes [out, in/2] and exponents [out, in/32],
// [out, in] layout, `in` a multiple of 32 (the loader checks what a file holds).
void check_mxfp4(const Weight& W) {
  LINEAGE_CHECK(W.layout == Layout::OutIn, "MXFP4 weights are [out, in]");
  LINEAGE_CHECK(W.w->dtype() == DType::U8 && W.scales->dtype() == DType::U8 && W.scales->ndim() == 2,
                "MXFP4 weights: U8 codes and U8 scales, got ", dtype_name(W.w->dtype()), " and ",
                dtype_name(W.scales->dtype()));
  LINEAGE_CHECK(W.in() % 32 == 0 && W.scales->dim(0) == W.out() && W.scales->dim(1) == W.in() / 32,
                "MXFP4 weights: in = ", W.in(), " must be a multiple of 32 and the scales [", W.out(), ", ",
                W.in() / 32, "], got [", W.scales->dim(0), ", ", W.scales->dim(1), "]");
}
const uint8_t* codes(const Weight& W) { return static_cast<const uint8_t*>(W.w->raw()); }
const uint8_t* exponents(const Weight& W) { return static_cast<const uint8_t*>(W.scales->raw()); }

// `rows` rows of x in the order MXFP4 kernels K read it (GemvMxfp4, or GemvMxfp4Dot's rounded to
// bf16: X its element), k.stride(in) values apart, in per-thread scratch.
template <class X, class K>
const X* mxfp4_prepared(const K& k, const float* x, int64_t rows, int64_t in, std::vector<char>& buf) {
  const int64_t ld = k.stride(in);
  auto* xm = static_cast<X*>(aligned_scratch(buf, size_t(rows * ld) * sizeof(X)));
  for (int64_t t = 0; t < rows; ++t) k.prepare(x + t * in, in, xm + t * ld);
  return xm;
}

// The MXFP4 kernels of the bf16 dot mode where W asks for them and this CPU has them, else null.
const GemvMxfp4Dot* mxfp4_dot(const Weight& W) { return W.mxfp4() && W.bf16_dot ? gemv_mxfp4_dot() : nullptr; }

// A quantized weight's contract (QuantWeight, linear.h); the loader checks what a file holds.
void check_quant(const Weight& W) {
  const QuantWeight& q = *W.quant;
  if (q.codes == QuantCodes::Ggml) {
    const GgmlBlockInfo& b = ggml_block_info(q.ggml);
    LINEAGE_CHECK(W.layout == Layout::OutIn && q.in % b.values == 0 && q.row_bytes == q.in / b.values * b.bytes &&
                      q.out == W.out(),
                  b.name, " weights: in = ", q.in, ", ", q.row_bytes, " bytes a row, out = ", q.out);
    return;
  }
  LINEAGE_CHECK(W.layout == Layout::OutIn && q.in % (q.nibbles() ? 32 : 16) == 0 && q.group > 0 &&
                    (q.group % 16 == 0 || q.group == q.in) && q.groups == (q.in + q.group - 1) / q.group &&
                    q.row_bytes == (q.nibbles() ? q.in / 2 : q.in) && q.out == W.out(),
                "quantized weights: in = ", q.in, ", group ", q.group, " (", q.groups, " a row), ", q.row_bytes,
                " bytes a row, out = ", q.out);
}

// The quantized kernels for W: the int8-activation ones where W asks for them and they take it, else
// the exact ones of this ISA.
const GemvQuant& quant_kernels(const GemvTable& k, const QuantWeight& W) {
  if (W.int8_dot)
    if (const GemvQuant* t = gemv_quant_int8(); t && t->order(W) >= 0) return *t;
  return k.quant;
}

// `rows` rows of x in the quantized kernels' order (GemvQuant::prepare), W.in floats apart, in
// per-thread scratch.
const float* quant_prepared(const GemvTable& k, const QuantWeight& W, const float* x, int64_t rows, std::vector<char>& buf) {
  auto* xq = static_cast<float*>(aligned_scratch(buf, size_t(rows * W.in) * sizeof(float)));
  const GemvQuant& q = quant_kernels(k, W);
  for (int64_t t = 0; t < rows; ++t) q.prepare(W, x + t * W.in, xq + t * W.in);
  return xq;
}

// Up to this many rows of x, [out, in] weights take gemv_rows instead of the GEMM: as fast or faster
// at 2 to 8 rows (each weight streamed once, no panels packed; bench `linear/batch8/*`), and each row
// gets a lone GEMV's bits, so a decoding sequence gives the same logits alone and in a batch of up to
// 8. From 16 rows on the GEMM's register tiles win (`linear/batch32/*`: 1.3-2.7x).
constexpr int64_t kGemvRowsMax = 8;

// Rows [o0, o1) of one GEMV's y, just computed: y += bias, then y ← act(y), then o.then, on this thread.
void finish_rows(const LinearOut& o, int64_t o0, int64_t o1) {
  if (o.bias) {
    constexpr int64_t kBlock = 256;
    float b[kBlock];
    for (int64_t c = o0; c < o1; c += kBlock) {
      const int64_t n = std::min(kBlock, o1 - c);
      widen_row(*o.bias, c, n, b);
      for (int64_t i = 0; i < n; ++i) o.y[c + i] += b[i];
    }
  }
  if (o.act) activate_serial(*o.act, o.y + o0, o1 - o0);
  if (o.then) o.then(o0, o1);
}

// [out, in] weights: GEMV output rows are handed out in chunks of whole 128s (gemv_chunk), each a
// contiguous block of the weight.
int64_t gemv_chunk(int64_t in) { return (std::max<int64_t>(128, grain_for(in)) + 127) / 128 * 128; }

// [in, out] weights: pieces of whole input rows (each also contiguous), of about kPieceElements
// weights, the same for any thread count and group; a piece sums its rows into a partial y of its
// own, and the partials are added in order once all are done, so the result depends on neither.
constexpr int64_t kPieceElements = 131072;  // 256 KiB of bf16
int64_t gemv_piece_rows(int64_t in, int64_t out) {
  const int64_t rows = std::max<int64_t>(8, (kPieceElements / std::max<int64_t>(1, out) + 7) / 8 * 8);
  return std::max<int64_t>(1, std::min(in, rows));
}

// A partial of an [in, out] weight starts `lead` floats into its slot, so that where the kernel
// starts a row's vector loop on a cache line of the weight (gemv_simd.h, to_line) the partial sums
// it reads and writes beside them are on a line too (the rows of a matrix whose rows are whole lines
// all start at the same place in a line). Slots have room for the lead.
int64_t partial_lead(const Weight& W) {
  const int64_t elem = int64_t(dtype_size(W.w->dtype()));
  const auto addr = reinterpret_cast<uintptr_t>(W.w->raw());
  const int64_t head = addr % elem ? 0 : int64_t((64 - addr % 64) % 64) / elem;
  return (16 - head % 16) % 16;
}
int64_t partial_stride(int64_t out) { return (out + 15) / 16 * 16 + 16; }

// Units of a GEMV group's work: output j's rows [a, b) ([out, in] weights, part < 0), or input rows
// [a, b) of its weight summed into the partial at float offset `part` ([in, out] weights).
struct GemvUnit {
  int64_t j, a, b, part;
};

// Rows [u.a, u.b) of output o on the exact path (k), or for BF16 weights in the bf16 dot mode (dot
// not null) with x as the bf16 pairs xp ([out, in]) or as x rounded to bf16 (xr, [in, out]); MXFP4
// weights read x prepared for them (xm; xmd in the bf16 dot mode), quantized ones theirs (xq: the
// order GemvQuant::order names for the weight, prepared once for the group).
void gemv_unit(const GemvTable& k, const GemvBf16Dot* dot, const float* x, const uint32_t* xp, const float* xr,
               const float* xm, const uint16_t* xmd, const float* xq, const LinearOut& o, const GemvUnit& u,
               float* partials) {
  if (o.W.quant) {
    quant_kernels(k, *o.W.quant).out_in(xq, *o.W.quant, u.a, u.b, o.y);
    return;
  }
  if (o.W.mxfp4()) {
    if (const GemvMxfp4Dot* d = mxfp4_dot(o.W)) d->out_in(xmd, codes(o.W), exponents(o.W), o.W.in(), u.a, u.b, o.y);
    else k.mxfp4.out_in(xm, codes(o.W), exponents(o.W), o.W.in(), u.a, u.b, o.y);
    return;
  }
  const int dt = dtype_index(o.W.w->dtype());
  if (o.W.layout == Layout::InOut) {
    k.in_out[dt](dot ? xr : x, o.W.w->raw(), o.W.out(), u.a, u.b, partials + u.part);
  } else if (dot) {
    dot->out_in(xp, static_cast<const uint16_t*>(o.W.w->raw()), o.W.in(), u.a, u.b, o.y);
  } else {
    k.out_in[dt](x, o.W.w->raw(), o.W.in(), u.a, u.b, o.y);
  }
}

// The GEMM this CPU and the call's weight option ask for, or null for OpenBLAS.
const GemmPath* own_gemm(const Weight& W) {
  const GemmTable& t = gemm_table();
  if (W.mxfp4()) return t.mxfp4;
  if (W.w->dtype() == DType::BF16 && t.bf16_dot && W.bf16_dot) return t.bf16_dot;
  return t.exact;
}

// The GEMVs of several weights on one input, in one parallel region: every output is cut into
// units (gemv_chunk, gemv_piece_rows), and the units of all outputs, in order, into one near-equal
// share per thread (parallel_shares: a thread streams its share front to back, then helps with the
// others' from their back ends). The last kTailChunksPerThread [out, in] chunks of each share are cut
// in eighths (kTailCuts), so the threads finish within an eighth of a chunk of each other: timing every
// region of GPT-2 bf16 decode, the threads' waits at region ends came to 172–216 µs a token with
// eighths against 240–326 with quarters (three alternating rounds; sixteenths 124–216).
// A unit adds the bias and activation to its own rows ([out, in]); for [in, out] weights the thread
// that completes an output's last piece adds its partials (in order, so the result does not depend on
// which thread ran which piece), then the bias and activation. BF16 weights in the bf16 dot mode read
// x rounded to bf16 pairs by the bf16 GEMM's own `prepare` (once for the group), so one token decoded
// gives what the same token gives inside a prefill.
constexpr int64_t kTailChunksPerThread = 2, kTailCuts = 8;
void gemv_group(const float* x, std::span<const LinearOut> outs) {
  const GemvTable& k = gemv_table();
  const GemmPath* dot_path = gemm_table().bf16_dot;
  const GemvBf16Dot* dot = gemv_bf16_dot();
  thread_local std::vector<char> prepared, rounded_x, partial_buf, mxfp4_x, mxfp4_dot_x, quant_x[GemvQuant::kOrders];
  const uint32_t* xp = nullptr;
  const float* xr = nullptr, *xm = nullptr, *xq[GemvQuant::kOrders] = {};
  const uint16_t* xmd = nullptr;
  auto rounded = [&](const LinearOut& o) { return dot && dot_path && own_gemm(o.W) == dot_path; };
  for (const LinearOut& o : outs) {
    LINEAGE_CHECK(o.W.in() == outs[0].W.in(), "linear_group: weights of different input sizes");
    if (const GemvMxfp4Dot* d = mxfp4_dot(o.W)) {
      if (!xmd) xmd = mxfp4_prepared<uint16_t>(*d, x, 1, o.W.in(), mxfp4_dot_x);
    } else if (o.W.mxfp4() && !xm) {
      xm = mxfp4_prepared<float>(k.mxfp4, x, 1, o.W.in(), mxfp4_x);
    }
    if (o.W.quant) {
      const int order = quant_kernels(k, *o.W.quant).order(*o.W.quant);
      if (!xq[order]) xq[order] = quant_prepared(k, *o.W.quant, x, 1, quant_x[order]);
    }
    if (xp || !rounded(o)) continue;
    const int64_t in = o.W.in();
    auto* buf = static_cast<uint32_t*>(aligned_scratch(prepared, dot_path->prepared_bytes(1, in)));
    dot_path->prepare(GemmProblem{x, o.W.w->raw(), 2, o.W.layout == Layout::OutIn, 1, in, o.W.out(), o.y}, 0, 1, buf);
    xp = buf;
  }
  for (const LinearOut& o : outs) {  // [in, out] weights read the same bf16 values as floats
    if (xr || !xp || !rounded(o) || o.W.layout != Layout::InOut) continue;
    const int64_t in = o.W.in();
    auto* r = static_cast<float*>(aligned_scratch(rounded_x, size_t(in) * 4));
    for (int64_t i = 0; i < in; ++i) {
      const uint32_t bits = (i % 2 ? xp[i / 2] >> 16 : xp[i / 2] & 0xffffu) << 16;
      std::memcpy(r + i, &bits, 4);
    }
    xr = r;
  }
  thread_local std::vector<GemvUnit> units;
  thread_local std::vector<int64_t> starts;
  thread_local std::vector<std::array<int64_t, 2>> spans;  // [in, out] outputs: first partial's offset, count
  units.clear();
  starts.clear();
  spans.assign(outs.size(), {0, 0});
  auto piece = [&](const LinearOut& o) {
    return o.W.layout == Layout::OutIn ? gemv_chunk(o.W.in()) : gemv_piece_rows(o.W.in(), o.W.out());
  };
  int64_t total = 0;
  for (const LinearOut& o : outs) total += ceil_div(o.W.layout == Layout::OutIn ? o.W.out() : o.W.in(), piece(o));
  const int64_t parts = parts_for(total);
  int64_t index = 0, share = 0, floats = 0;  // the piece's index and its share; partial floats so far
  for (size_t j = 0; j < outs.size(); ++j) {
    const LinearOut& o = outs[j];
    const bool rows = o.W.layout == Layout::OutIn;
    const int64_t n = rows ? o.W.out() : o.W.in(), step = piece(o), stride = partial_stride(o.W.out());
    const int64_t lead = rows ? 0 : partial_lead(o.W);
    if (!rows) spans[j][0] = floats + lead;
    if (!rows && n == 0) {  // no input rows: nothing to sum
      std::fill(o.y, o.y + o.W.out(), 0.0f);
      finish_rows(o, 0, o.W.out());
    }
    for (int64_t a = 0; a < n; a += step, ++index) {
      while (share < parts && index == total * share / parts) {
        starts.push_back(int64_t(units.size()));
        ++share;
      }
      const bool tail = rows && index >= total * share / parts - kTailChunksPerThread;
      const int64_t b = std::min(n, a + step), cut = tail ? step / kTailCuts : step;
      for (int64_t c = a; c < b; c += cut) {
        units.push_back({int64_t(j), c, std::min(b, c + cut), rows ? -1 : floats + lead});
        if (!rows) floats += stride, ++spans[j][1];
      }
    }
  }
  starts.push_back(int64_t(units.size()));
  if (units.empty()) return;
  float* partials = floats ? static_cast<float*>(aligned_scratch(partial_buf, size_t(floats) * 4)) : nullptr;
  thread_local std::unique_ptr<std::atomic<int64_t>[]> left;  // [in, out] outputs: pieces not yet done
  thread_local size_t left_size = 0;
  if (left_size < outs.size()) left.reset(new std::atomic<int64_t>[left_size = outs.size()]);
  for (size_t j = 0; j < outs.size(); ++j) left[j].store(spans[j][1], std::memory_order_relaxed);
  const GemvUnit* u = units.data();  // thread_locals named inside the lambda would be the worker's own
  const auto* sp = spans.data();
  std::atomic<int64_t>* remaining = left.get();
  parallel_shares(starts, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const LinearOut& o = outs[size_t(u[i].j)];
      const float* xo = o.W.quant ? xq[quant_kernels(k, *o.W.quant).order(*o.W.quant)] : nullptr;
      gemv_unit(k, rounded(o) ? dot : nullptr, x, xp, xr, xm, xmd, xo, o, u[i], partials);
      if (u[i].part < 0) {
        finish_rows(o, u[i].a, u[i].b);
      } else if (remaining[u[i].j].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        const auto [first, count] = sp[u[i].j];
        k.sum_parts(partials + first, count, partial_stride(o.W.out()), o.W.out(), o.y);
        finish_rows(o, 0, o.W.out());
      }
    }
  });
}

// A few rows of x (a batch of decode tokens) against [out, in] weights: the GEMV's loop over each
// weight row, shared by all rows of x (out_in_rows), so the weights stream from memory once, and
// each row's result is bit for bit what a lone GEMV gives it. Output rows in the GEMV's chunks over
// the threads; each chunk's bias and activation added by the thread that computed it.
void gemv_rows(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y, std::optional<Activation> act) {
  const GemvTable& k = gemv_table();
  const GemmPath* dot_path = gemm_table().bf16_dot;
  const GemvBf16Dot* dot = own_gemm(W) == dot_path && dot_path ? gemv_bf16_dot() : nullptr;
  const int64_t in = W.in(), out = W.out();
  thread_local std::vector<char> prepared;
  if (W.quant) {
    const float* xq = quant_prepared(k, *W.quant, x, T, prepared);
    const GemvQuant& q = quant_kernels(k, *W.quant);
    parallel_chunks(out, gemv_chunk(in * T), [&](int64_t o0, int64_t o1) {
      q.out_in_rows(xq, in, T, *W.quant, o0, o1, y, out);
      for (int64_t t = 0; t < T; ++t) finish_rows(LinearOut{W, bias, y + t * out, act}, o0, o1);
    });
    return;
  }
  if (const GemvMxfp4Dot* d = mxfp4_dot(W)) {
    const uint16_t* xd = mxfp4_prepared<uint16_t>(*d, x, T, in, prepared);
    parallel_chunks(out, gemv_chunk(in * T), [&](int64_t o0, int64_t o1) {
      d->out_in_rows(xd, d->stride(in), T, codes(W), exponents(W), in, o0, o1, y, out);
      for (int64_t t = 0; t < T; ++t) finish_rows(LinearOut{W, bias, y + t * out, act}, o0, o1);
    });
    return;
  }
  if (W.mxfp4()) {
    const float* xm = mxfp4_prepared<float>(k.mxfp4, x, T, in, prepared);
    parallel_chunks(out, gemv_chunk(in * T), [&](int64_t o0, int64_t o1) {
      k.mxfp4.out_in_rows(xm, k.mxfp4.stride(in), T, codes(W), exponents(W), in, o0, o1, y, out);
      for (int64_t t = 0; t < T; ++t) finish_rows(LinearOut{W, bias, y + t * out, act}, o0, o1);
    });
    return;
  }
  const uint32_t* xp = nullptr;
  int64_t ldxp = 0;
  if (dot) {
    auto* buf = static_cast<uint32_t*>(aligned_scratch(prepared, dot_path->prepared_bytes(T, in)));
    dot_path->prepare(GemmProblem{x, W.w->raw(), 2, true, T, in, out, y}, 0, T, buf);
    xp = buf;
    ldxp = int64_t(dot_path->prepared_bytes(1, in) / sizeof(uint32_t));
  }
  const int dt = dtype_index(W.w->dtype());
  parallel_chunks(out, gemv_chunk(in * T), [&](int64_t o0, int64_t o1) {
    if (dot) dot->out_in_rows(xp, ldxp, T, static_cast<const uint16_t*>(W.w->raw()), in, o0, o1, y, out);
    else k.out_in_rows[dt](x, in, T, W.w->raw(), in, o0, o1, y, out);
    for (int64_t t = 0; t < T; ++t) finish_rows(LinearOut{W, bias, y + t * out, act}, o0, o1);
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

// MXFP4 weights where this ISA has no own GEMM: x prepared in the MXFP4 kernels' order once, then a
// panel of kPanel weight rows at a time decoded (in that order) into per-thread scratch and sgemm'd,
// as gemm_widened does; the reduction is over the same columns, only permuted alike in x and W.
void gemm_mxfp4_widened(const float* x, int64_t T, const Weight& W, float* y) {
  const GemvTable& k = gemv_table();
  const int64_t in = W.in(), out = W.out(), ld = k.mxfp4.stride(in);
  constexpr int64_t kPanel = 64;
  thread_local std::vector<char> prepared;
  const float* xm = mxfp4_prepared<float>(k.mxfp4, x, T, in, prepared);
  parallel_for(ceil_div(out, kPanel), [&](int64_t p0, int64_t p1) {
    single_threaded_blas();
    thread_local std::vector<float> buf;
    buf.resize(size_t(kPanel * ld));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o0 = p * kPanel, n = std::min(kPanel, out - o0);
      k.mxfp4.decode(codes(W), exponents(W), in, o0, o0 + n, buf.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, ld, 1.0f, xm, ld, buf.data(), ld, 0.0f, y + o0, out);
    }
  }, grain_for(kPanel * in * T));
}

// Quantized weights: x prepared in the kernels' order once, then a panel of kPanel weight rows at a
// time decoded (in that order) into per-thread scratch and multiplied by the exact GEMM's register
// tiles where this ISA has them (the panel an F32 [out, in] matrix), by OpenBLAS otherwise; the
// reduction is over the same columns, only permuted alike in x and W.
void gemm_quant(const float* x, int64_t T, const Weight& W, float* y) {
  const GemvTable& k = gemv_table();
  const GemmPath* own = gemm_table().exact;
  const QuantWeight& q = *W.quant;
  const int64_t in = q.in, out = q.out;
  const int64_t panel = own ? std::min<int64_t>(own->nc_max / own->nr * own->nr, 96) : 64;
  thread_local std::vector<char> prepared;
  const float* xq = quant_prepared(k, q, x, T, prepared);
  parallel_for(ceil_div(out, panel), [&](int64_t p0, int64_t p1) {
    single_threaded_blas();
    thread_local std::vector<char> decoded, scratch;
    auto* buf = static_cast<float*>(aligned_scratch(decoded, size_t(panel * in) * sizeof(float)));
    void* tiles = own ? aligned_scratch(scratch, own->scratch_bytes) : nullptr;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o0 = p * panel, n = std::min(panel, out - o0);
      k.quant.decode(q, o0, o0 + n, buf);
      if (own) {
        GemmProblem sub{xq, buf, 0, true, T, in, n, y + o0};
        sub.ldy = out;
        own->block(sub, nullptr, 0, T, 0, n, tiles);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, in, 1.0f, xq, in, buf, in, 0.0f, y + o0, out);
      }
    }
  }, grain_for(panel * in * T));
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

bool bf16_dot_available() { return gemm_table().bf16_dot != nullptr; }
bool runs_bf16_dot(const Weight& W) {
  return W.bf16_dot && bf16_dot_available() && (W.mxfp4() || (!W.quant && W.w->dtype() == DType::BF16));
}

bool int8_dot_available() { return gemv_quant_int8() != nullptr; }

bool runs_int8_dot(const QuantWeight& W) { return &quant_kernels(gemv_table(), W) != &gemv_table().quant; }

KernelTable kernel_table() { return {isa_name(), gemm_table().exact != nullptr, gemm_table().bf16_dot != nullptr}; }

void widen_row(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  if (t.dtype() == DType::F64) {
    for (int64_t i = 0; i < n; ++i) dst[i] = float(t.data<double>()[offset + i]);
    return;
  }
  const int dt = dtype_index(t.dtype());
  gemv_table().widen[dt](static_cast<const char*>(t.raw()) + offset * dtype_size(t.dtype()), n, dst);
}

namespace {

// More than kGemvRowsMax rows of x against quantized weights in the int8-activation mode: the rows
// GEMV's arithmetic (each row of y what a lone GEMV gives it), over tiles of kTileRows weight rows
// (from L1) and kTileX rows of x at a time.
void gemm_quant_int8(const float* x, int64_t T, const Weight& W, float* y) {
  constexpr int64_t kTileRows = 16, kTileX = 64;
  const GemvTable& k = gemv_table();
  const int64_t in = W.in(), out = W.out();
  thread_local std::vector<char> prepared;
  const float* xq = quant_prepared(k, *W.quant, x, T, prepared);
  const GemvQuant& q = quant_kernels(k, *W.quant);
  parallel_chunks(out, kTileRows, [&](int64_t o0, int64_t o1) {
    for (int64_t t0 = 0; t0 < T; t0 += kTileX)
      for (int64_t a = o0; a < o1; a += kTileRows)
        q.out_in_rows(xq + t0 * in, in, std::min(kTileX, T - t0), *W.quant, a, std::min(o1, a + kTileRows),
                      y + t0 * out, out);
  });
}

// linear() on every row of W, on this process alone.
void linear_whole(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y,
                  std::optional<Activation> act) {
  if (T > kGemvRowsMax && W.quant && runs_int8_dot(*W.quant)) {
    gemm_quant_int8(x, T, W, y);
    add_bias(bias, T, W.out(), y);
    if (act) activate(*act, y, T * W.out());
    return;
  }
  if (T > 1 && T <= kGemvRowsMax && W.layout == Layout::OutIn) {
    gemv_rows(x, T, W, bias, y, act);
    return;
  }
  if (T > kGemvRowsMax)  // MXFP4 in the bf16 dot mode: x rounded as the GEMVs round it, then the exact GEMM
    if (const GemvMxfp4Dot* d = mxfp4_dot(W)) {
      thread_local std::vector<char> rounded;
      auto* r = static_cast<float*>(aligned_scratch(rounded, size_t(T * W.in()) * sizeof(float)));
      d->round(x, T * W.in(), r);
      x = r;
    }
  const GemmPath* own = W.quant ? nullptr : own_gemm(W);
  if (T > 1 && own) {  // adds the bias (and GELU) as it stores y
    const float* b = nullptr;
    thread_local std::vector<float> widened;
    if (bias) {
      widened.resize(W.out());
      widen_row(*bias, 0, W.out(), widened.data());
      b = widened.data();
    }
    GemmProblem p{x, W.w->raw(), W.mxfp4() ? 3 : dtype_index(W.w->dtype()), W.layout == Layout::OutIn, T, W.in(),
                  W.out(), y, b};
    p.gelu = act == Activation::GeluTanh;
    if (W.mxfp4()) p.scales = exponents(W);
    gemm_blocked(*own, p);
    if (act && !p.gelu) activate(*act, y, T * W.out());
    return;
  }
  if (T == 1) {
    const LinearOut one{W, bias, y, act};
    gemv_group(x, {&one, 1});
    return;
  }
  if (W.quant) {
    gemm_quant(x, T, W, y);
  } else if (W.mxfp4()) {
    gemm_mxfp4_widened(x, T, W, y);
  } else if (W.w->dtype() == DType::F32) {
    gemm_f32(x, T, W, y);
  } else {
    gemm_widened(x, T, W, y);
  }
  add_bias(bias, T, W.out(), y);
  if (act) activate(*act, y, T * W.out());
}

}  // namespace

void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y, std::optional<Activation> act) {
  LINEAGE_CHECK(W.w && W.w->ndim() == 2, "linear needs a 2-D weight");
  if (W.mxfp4()) check_mxfp4(W);
  if (W.quant) check_quant(W);
  if (T <= 0) return;
  const LinearOut one{W, bias, y, act};
  if (!linear_group_split(x, T, {&one, 1}, linear_whole)) linear_whole(x, T, W, bias, y, act);
}

void linear_rows(const float* x, int64_t T, const Weight& W, int64_t o0, int64_t o1, float* y) {
  LINEAGE_CHECK(W.w && W.w->ndim() == 2 && W.layout == Layout::OutIn && 0 <= o0 && o0 <= o1 && o1 <= W.out(),
                "linear_rows needs rows of a weight stored [out, in]");
  if (W.mxfp4()) check_mxfp4(W);
  if (W.quant) check_quant(W);
  linear_rows_with(x, T, W, o0, o1, y, linear_whole);
}

bool linear_strided(const float* x, int64_t ldx, bool x_trans, int64_t T, const Weight& W, float* y, int64_t ldy,
                    bool accumulate) {
  LINEAGE_CHECK(W.w && W.w->ndim() == 2, "linear needs a 2-D weight");
  const GemmPath* own = x_trans ? gemm_table().exact_strips : gemm_table().exact;
  if (!own || W.mxfp4() || W.quant || W.w->dtype() != DType::F32) return false;
  if (T <= 0) return true;
  GemmProblem p{x, W.w->raw(), 0, W.layout == Layout::OutIn, T, W.in(), W.out(), y};
  p.ldx = ldx, p.ldy = ldy, p.accumulate = accumulate;
  gemm_blocked(*own, p);
  return true;
}

void linear_group(const float* x, int64_t T, std::span<const LinearOut> outs) {
  for (const LinearOut& o : outs) {
    LINEAGE_CHECK(o.W.w && o.W.w->ndim() == 2, "linear needs a 2-D weight");
    LINEAGE_CHECK(T == 1 || !o.then, "linear_group: `then` is for one token, got ", T);
    if (o.W.mxfp4()) check_mxfp4(o.W);
    if (o.W.quant) check_quant(o.W);
  }
  if (row_split_active() && linear_group_split(x, T, outs, linear_whole)) {  // the outputs' rows in one gather
    for (const LinearOut& o : outs)
      if (o.then) o.then(0, o.W.out());
    return;
  }
  if (T != 1) {  // GEMMs are one region each anyway
    for (const LinearOut& o : outs) linear(x, T, o.W, o.bias, o.y, o.act);
    return;
  }
  gemv_group(x, outs);
}

MatrixFormat Matrix::format() const {
  if (quant.defined()) {
    LINEAGE_CHECK(qw.q, "a quantized weight matrix used before prepare_quant");
    return MatrixFormat::Quantized;
  }
  switch (data.dtype()) {
    case DType::F32: return MatrixFormat::F32;
    case DType::F16: return MatrixFormat::F16;
    case DType::BF16: return MatrixFormat::BF16;
    case DType::U8: if (scales.defined()) return MatrixFormat::MXFP4; [[fallthrough]];
    default: LINEAGE_CHECK(false, "a weight matrix of ", dtype_name(data.dtype()), " data has no format");
  }
  return MatrixFormat::F32;
}

// The one place the linear kernels dispatch on a matrix's format.
Weight Matrix::view(bool bf16_dot) const {
  switch (format()) {
    case MatrixFormat::F32:
    case MatrixFormat::F16:
    case MatrixFormat::BF16: break;
    case MatrixFormat::MXFP4: return {&data, layout, bf16_dot, &scales};
    case MatrixFormat::Quantized: return {&codes, Layout::OutIn, bf16_dot, nullptr, &qw};
  }
  return {&data, layout, bf16_dot};
}

int64_t first_nan_scale(const Matrix& W) {
  if (!W.scales.defined() || W.format() != MatrixFormat::MXFP4) return -1;
  return first_nan_scale(W.scales);
}

int64_t first_nan_scale(const Tensor& scales) {
  if (!scales.defined() || scales.dtype() != DType::U8) return -1;
  const auto* s = static_cast<const uint8_t*>(scales.raw());
  const uint8_t* bad = std::find(s, s + scales.numel(), uint8_t(255));
  return bad == s + scales.numel() ? -1 : int64_t(bad - s);
}

void linear(const float* x, int64_t T, const Matrix& W, const Tensor* bias, float* y, std::optional<Activation> act,
            bool bf16_dot) {
  linear(x, T, W.view(bf16_dot), bias, y, act);
}

void store_out_in(Matrix& W) {
  if (W.layout == Layout::OutIn || !W.data.defined() || W.quant.defined()) return;
  W.data = transposed(W.data);
  W.layout = Layout::OutIn;
}

}  // namespace lineage::kernels
