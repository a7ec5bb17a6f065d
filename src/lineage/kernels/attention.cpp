#include "lineage/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/blas_threads.h"
#include "lineage/kernels/vmath.h"
#include "lineage/kernels/x86/attention.h"
#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/latent_attention_loops.h"

namespace lineage::kernels {

namespace {

constexpr int64_t kTile = 64;  // keys scored per step of the online softmax

void attend_one(const float* q, int64_t n_keys, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t dk,
                int64_t dv, float scale, float* out, float* acc) {
  float s[kTile], p[kTile];
  float m = -INFINITY, l = 0.0f;
  std::fill(acc, acc + dv, 0.0f);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kTile) {
    const int64_t n = std::min(kTile, n_keys - j0);
    float tile_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k + (j0 + j) * ldk;
      float d = 0.0f;
#pragma omp simd reduction(+ : d)
      for (int64_t c = 0; c < dk; ++c) d += q[c] * kj[c];
      s[j] = d * scale;
      tile_max = std::max(tile_max, s[j]);
    }
    const float m_new = std::max(m, tile_max);
    const float correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first tile
    for (int64_t j = 0; j < n; ++j) s[j] -= m_new;
    exp_nonpositive(s, p, n);  // the whole tile's weights in one vectorized call
    float tile_sum = 0.0f;
#pragma omp simd reduction(+ : tile_sum)
    for (int64_t j = 0; j < n; ++j) tile_sum += p[j];
    l = l * correction + tile_sum;
    for (int64_t c = 0; c < dv; ++c) acc[c] *= correction;
    for (int64_t j = 0; j < n; ++j) {
      const float pj = p[j];
      const float* vj = v + (j0 + j) * ldv;
#pragma omp simd
      for (int64_t c = 0; c < dv; ++c) acc[c] += pj * vj[c];
    }
    m = m_new;
  }
  const float inv = 1.0f / l;
  for (int64_t c = 0; c < dv; ++c) out[c] = acc[c] * inv;
}

// Prefill: a tile of up to kQTile queries of one head against key tiles of kKTile, the scores and
// the weighted values as small matrix products (OpenBLAS), the softmax online across key tiles. The
// portable build: with AVX-512, x86/attention_avx512.cpp runs instead (scores transposed, its own
// register tiles).
constexpr int64_t kQTile = kAttentionQueryTile, kKTile = 256;

// y[T, out] = x[T, in] · W, W stored [out, in] (out_in) or [in, out] with row stride ldw, x and y
// contiguous f32, on the caller's thread.
void small_gemm(const float* x, int64_t T, int64_t in, const float* w, int64_t ldw, bool out_in, int64_t out,
                float* y) {
  single_threaded_blas();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans, T, out, in, 1.0f, x, in, w, ldw, 0.0f,
              y, out);
}

void attend_tile(const float* q, int64_t ldq, int64_t nq, int64_t first_pos, const float* k, int64_t ldk,
                 const float* v, int64_t ldv, int64_t dk, int64_t dv, float scale, float* out, int64_t ldo) {
  thread_local std::vector<float> Q, S, O, PV, m, l;
  Q.resize(nq * dk);  // the tile's queries, contiguous and pre-scaled
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t c = 0; c < dk; ++c) Q[i * dk + c] = q[i * ldq + c] * scale;
  S.resize(kQTile * kKTile);
  PV.resize(nq * dv);
  O.assign(nq * dv, 0.0f);
  m.assign(nq, -INFINITY);
  l.assign(nq, 0.0f);
  const int64_t n_keys = first_pos + nq;  // keys visible to the tile's last query
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKTile) {
    const int64_t nk = std::min(kKTile, n_keys - j0);
    small_gemm(Q.data(), nq, dk, k + j0 * ldk, ldk, true, nk, S.data());
    for (int64_t i = 0; i < nq; ++i) {
      float* row = S.data() + i * nk;
      const int64_t valid = std::clamp<int64_t>(first_pos + i + 1 - j0, 0, nk);  // causal: key ≤ query
      if (valid == 0) {
        std::fill(row, row + nk, 0.0f);
        continue;
      }
      float mx = m[i];
#pragma omp simd reduction(max : mx)
      for (int64_t c = 0; c < valid; ++c) mx = std::max(mx, row[c]);
      const float correction = std::exp(m[i] - mx);  // exp(-inf) = 0 on the first tile
#pragma omp simd
      for (int64_t c = 0; c < valid; ++c) row[c] -= mx;
      float tmp[kKTile];
      exp_nonpositive(row, tmp, valid);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < valid; ++c) sum += (row[c] = tmp[c]);
      std::fill(row + valid, row + nk, 0.0f);
      l[i] = l[i] * correction + sum;
      m[i] = mx;
      if (correction != 1.0f)
        for (int64_t c = 0; c < dv; ++c) O[i * dv + c] *= correction;
    }
    small_gemm(S.data(), nq, nk, v + j0 * ldv, ldv, false, dv, PV.data());
    for (int64_t i = 0; i < nq * dv; ++i) O[i] += PV[i];
  }
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t c = 0; c < dv; ++c) out[i * ldo + c] = O[i * dv + c] / l[i];
}

}  // namespace

void attention_causal(std::span<const AttentionSeq> seqs, const AttentionHeads& hs) {
  static const bool avx512 = !std::strcmp(isa_name(), "avx512");
  const int64_t H = hs.H, dk = hs.dk, dv = hs.dv;
  const auto tiled = [&](const AttentionSeq& s) { return s.T >= 16; };
  const auto ldk = [&](const AttentionSeq& s) { return s.ldk ? s.ldk : dk; };
  const auto ldv = [&](const AttentionSeq& s) { return s.ldv ? s.ldv : dv; };
  // Prefill pieces: query tiles. Later query tiles see more keys. Ranked longest first (rank r:
  // head r % H, the (r / H)-th tile from the end), the (tile, head) items are dealt out like cards,
  // so each thread's share runs from long to short items, and the ones the threads take from each
  // other at the end are the shortest: the threads finish together.
  for (const AttentionSeq& s : seqs) {
    if (!tiled(s)) continue;
    const auto tile = avx512 ? attend_tile_avx512 : attend_tile;
    const int64_t tiles = (s.T + kQTile - 1) / kQTile;
    const int64_t n = H * tiles, parts = parts_for(n);
    int64_t starts[kMaxParts + 1] = {0};
    for (int64_t p = 0; p < parts; ++p) starts[p + 1] = starts[p] + (n - p + parts - 1) / parts;  // ranks ≡ p
    parallel_shares({starts, size_t(parts + 1)}, [&](int64_t i, int64_t) {
      int64_t p = 0;
      while (i >= starts[p + 1]) ++p;
      const int64_t r = (i - starts[p]) * parts + p;
      const int64_t h = r % H, t0 = (tiles - 1 - r / H) * kQTile, nq = std::min(kQTile, s.T - t0);
      tile(s.q + t0 * s.ldq + h * dk, s.ldq, nq, s.p0 + t0, s.k + h * s.k_stride, ldk(s), s.v + h * s.v_stride,
           ldv(s), dk, dv, hs.scale, s.out + t0 * s.ldo + h * dv, s.ldo);
    });
  }
  // Everything else, one query at a time: item i of sequence b is (token, head) = (i / H, i % H).
  thread_local std::vector<int64_t> first;  // first[b]: the first item of sequence b
  first.assign(1, 0);
  int64_t keys = 0;
  for (const AttentionSeq& s : seqs) {
    const int64_t items = tiled(s) ? 0 : s.T * H;
    first.push_back(first.back() + items);
    keys += items * (s.p0 + s.T);
  }
  const int64_t total = first.back();
  if (total == 0) return;
  const bool fast = avx512 && dk == dv && dk <= kAttentionDecodeMaxHead;
  const int64_t* f = first.data();  // thread_local: the workers must see the caller's
  parallel_chunks(total, grain_for(2 * (keys / total) * std::max(dk, dv)), [&](int64_t b, int64_t e) {
    thread_local std::vector<float> acc;  // the portable path's accumulator; the AVX-512 one keeps it in registers
    if (!fast) acc.resize(dv);
    int64_t si = std::upper_bound(f, f + seqs.size() + 1, b) - f - 1;
    for (int64_t i = b; i < e; ++i) {
      while (i >= f[si + 1]) ++si;
      const AttentionSeq& s = seqs[size_t(si)];
      const int64_t t = (i - f[si]) / H, h = (i - f[si]) % H;
      const float *q = s.q + t * s.ldq + h * dk, *k = s.k + h * s.k_stride, *v = s.v + h * s.v_stride;
      float* out = s.out + t * s.ldo + h * dv;
      if (fast) attend_one_avx512(q, s.p0 + t + 1, k, ldk(s), v, ldv(s), dk, hs.scale, out);
      else attend_one(q, s.p0 + t + 1, k, ldk(s), v, ldv(s), dk, dv, hs.scale, out, acc.data());
    }
  });
}

void latent_attention(std::span<const LatentQuery> qs, int64_t H, int64_t dk, int64_t dv, float scale) {
  static_assert(kLatentMaxValue == latent_loops::kMaxValue);
  LINEAGE_CHECK(dv <= kLatentMaxValue && dv <= dk, "latent attention: value width ", dv, " (at most ",
                kLatentMaxValue, " and the key width ", dk, ")");
  static const bool avx512 = !std::strcmp(isa_name(), "avx512");
  const auto loop = avx512 ? latent_heads_avx512 : +[](const float* q, int64_t ldq, int64_t G, int64_t n, const float* kv,
                                                       int64_t ldkv, int64_t dk, int64_t dv, float scale, float* out,
                                                       int64_t ldo) {
    latent_loops::heads(q, ldq, G, n, kv, ldkv, dk, dv, scale, out, ldo);
  };
  // Items: (query, group of heads). Groups of up to 8 heads read the rows once; a lone query is
  // split into as many groups as there are threads (each group reads the rows again, but they run
  // side by side).
  const int64_t Q = int64_t(qs.size());
  if (Q == 0) return;
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(H, (parts_for(Q * H) + Q - 1) / Q));
  const int64_t G = std::min<int64_t>(latent_loops::kMaxGroup, (H + want - 1) / want);
  const int64_t groups = (H + G - 1) / G;
  int64_t keys = 0;
  for (const LatentQuery& q : qs) keys += q.n_keys;
  parallel_chunks(Q * groups, grain_for(2 * (keys / Q) * (dk + dv) * G), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const LatentQuery& q = qs[size_t(i / groups)];
      const int64_t h0 = (i % groups) * G, g = std::min(G, H - h0);
      loop(q.q + h0 * q.ldq, q.ldq, g, q.n_keys, q.kv, q.ldkv, dk, dv, scale, q.out + h0 * q.ldo, q.ldo);
    }
  });
}

void attention_causal(const float* q, int64_t ldq, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t head_stride, int64_t H, int64_t hd, float scale, float* out) {
  const AttentionSeq s{q, ldq, T, p0, k, v, head_stride, head_stride, out, H * hd};
  attention_causal({&s, 1}, {H, hd, hd, scale});
}

namespace {

// softmax_j(scale · q·k_j) over n keys, row j at k + j·ldk, into w.
void softmax_scores(const float* q, const float* k, int64_t ldk, int64_t n, int64_t dk, float scale, float* w) {
  std::vector<double> s(size_t(std::max<int64_t>(n, 1)));
  double top = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < dk; ++c) dot += double(q[c]) * double(k[j * ldk + c]);
    s[size_t(j)] = dot * scale;
    top = std::max(top, s[size_t(j)]);
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += s[size_t(j)] = std::exp(s[size_t(j)] - top);
  for (int64_t j = 0; j < n; ++j) w[j] = float(s[size_t(j)] / sum);
}

}  // namespace

void attention_weights(const AttentionSeq& s, const AttentionHeads& hs, float* w, int64_t ldt) {
  const int64_t L = s.p0 + s.T, ldk = s.ldk ? s.ldk : hs.dk;
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < hs.H; ++h) {
      float* row = w + t * ldt + h * L;
      const int64_t n = s.p0 + t + 1;
      softmax_scores(s.q + t * s.ldq + h * hs.dk, s.k + h * s.k_stride, ldk, n, hs.dk, hs.scale, row);
      std::fill(row + n, row + L, 0.0f);
    }
}

void latent_attention_weights(const LatentQuery& q, int64_t H, int64_t dk, float scale, float* w) {
  for (int64_t h = 0; h < H; ++h) softmax_scores(q.q + h * q.ldq, q.kv, q.ldkv, q.n_keys, dk, scale, w + h * q.n_keys);
}

}  // namespace lineage::kernels
