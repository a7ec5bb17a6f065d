// Tiled online-softmax attention against the naive ref:: twin, with queries packed [T, H, hd] and
// read in place from wider rows (as from a fused q | k | v projection).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/kernels/attention.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"

namespace lineage::kernels {
namespace attention_test {
namespace {

TEST(Attention, MatchesRefOverLengthsAndThreads) {
  for (int threads : {1, 2, 3}) {  // 3: shares of unequal length in the prefill's dealing
    set_threads(threads);
    // hd 80: a head that is neither a multiple of 16 nor within one 64-column pass of the AVX-512
    // tile; (300, 40) and (0, 300): queries whose keys span two key tiles.
    for (int64_t hd : {1, 8, 64, 80})
      for (int64_t H : {1, 3})
        for (auto [p0, T] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, 1}, {0, 63}, {0, 64}, {0, 65}, {5, 1}, {100, 30}, {200, 1}, {300, 40}, {0, 300}}) {
          for (int64_t ldq : {H * hd, 3 * H * hd + 5}) {
            const int64_t cap = p0 + T + 3, n = T * H * hd;
            Rng rng(hd * 100 + H * 10 + T + ldq);
            std::vector<float> q(T * ldq), k(H * cap * hd), v(H * cap * hd), got(n), want(n);
            for (auto& x : q) x = 2 * rng.normal();
            for (auto& x : k) x = rng.normal();
            for (auto& x : v) x = rng.normal();
            const float scale = 1.0f / std::sqrt(float(hd));
            attention_causal(q.data(), ldq, T, p0, k.data(), v.data(), cap * hd, H, hd, scale, got.data());
            ref::attention_causal(q.data(), ldq, T, p0, k.data(), v.data(), cap * hd, H, hd, scale, want.data());
            double num = 0, den = 0;
            for (int64_t i = 0; i < n; ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
            ASSERT_LE(std::sqrt(num / den), 1e-5)
                << "hd " << hd << " H " << H << " p0 " << p0 << " T " << T << " ldq " << ldq;
          }
        }
  }
  set_threads(0);
}

// Several sequences in one call, each against its own keys, with q·k over dk channels and values of
// dv (MLA's 192 / 128 shape and smaller ones): the batched kernel against the ref twin, and each
// sequence equal bit for bit to a call of its own. Keys and values either in a cache's [H, cap, d]
// layout or position-major with row strides ([cap, H, dk] keys; values inside wider [cap, H, dv + 8]
// rows, as MLA reads them in place from kv_b's product).
TEST(Attention, BatchedSequencesWithSeparateHeadDims) {
  for (bool rows : {false, true})
    for (auto [dk, dv] : {std::array<int64_t, 2>{24, 16}, {16, 16}, {64, 64}, {192, 128}})
      for (int threads : {1, 2}) {
        set_threads(threads);
        constexpr int64_t H = 3, pad = 8;
        const std::vector<std::array<int64_t, 2>> shapes = {{0, 1}, {7, 1}, {0, 20}, {40, 3}, {100, 1}, {5, 70}};
        Rng rng(dk * 7 + dv + threads + rows);
        std::vector<std::vector<float>> q, k, v, got, want, alone;
        std::vector<AttentionSeq> seqs, ref_seqs;
        const int64_t vrow = rows ? dv + pad : dv;
        for (const auto& [p0, T] : shapes) {
          const int64_t cap = p0 + T + 2;
          q.emplace_back(size_t(T * H * dk)), k.emplace_back(size_t(H * cap * dk)), v.emplace_back(size_t(H * cap * vrow));
          for (auto* a : {&q.back(), &k.back(), &v.back()})
            for (float& x : *a) x = rng.normal();
          got.emplace_back(size_t(T * H * dv)), want.emplace_back(size_t(T * H * dv)), alone.emplace_back(size_t(T * H * dv));
        }
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto [p0, T] = shapes[i];
          const int64_t cap = p0 + T + 2;
          if (rows)
            seqs.push_back({q[i].data(), H * dk, T, p0, k[i].data(), v[i].data(), dk, vrow, got[i].data(), H * dv,
                            H * dk, H * vrow});
          else
            seqs.push_back({q[i].data(), H * dk, T, p0, k[i].data(), v[i].data(), cap * dk, cap * dv, got[i].data(),
                            H * dv});
          AttentionSeq r = seqs.back();
          r.out = want[i].data();
          ref_seqs.push_back(r);
        }
        const AttentionHeads heads{H, dk, dv, 1.0f / std::sqrt(float(dk))};
        attention_causal(seqs, heads);
        ref::attention_causal(ref_seqs, heads);
        for (size_t i = 0; i < shapes.size(); ++i) {
          AttentionSeq one = seqs[i];
          one.out = alone[i].data();
          attention_causal({&one, 1}, heads);
          EXPECT_EQ(got[i], alone[i]) << "sequence " << i << " dk " << dk << " dv " << dv;
          double num = 0, den = 0;
          for (size_t j = 0; j < got[i].size(); ++j)
            num += (got[i][j] - want[i][j]) * (got[i][j] - want[i][j]), den += want[i][j] * want[i][j];
          EXPECT_LE(std::sqrt(num / den), 1e-5) << "sequence " << i << " dk " << dk << " dv " << dv << " rows " << rows;
        }
      }
  set_threads(0);
}

// MLA's absorbed decode: H heads of one token against rows shared by every head (key = the first dk
// values of a row, value = its first dv), against the ref twin; a query's result is the same bits
// whatever else the call holds and however the heads are grouped over the threads.
TEST(Attention, LatentAttentionMatchesRefAndIsIndependentOfTheBatch) {
  for (auto [dk, dv] : {std::array<int64_t, 2>{576, 512}, {40, 32}, {17, 17}})
    for (int64_t H : {1, 3, 8, 9, 20})
      for (int threads : {1, 2, 3}) {
        set_threads(threads);
        const std::vector<int64_t> keys = {1, 2, 63, 64, 65, 300};
        const int64_t ld = dk + 3;  // rows wider than the key, as a cache of [ĉ | k_r | …] would be
        Rng rng(dk + H * 31 + threads);
        std::vector<std::vector<float>> q, kv, got, want, alone;
        std::vector<LatentQuery> qs, ref_qs;
        for (int64_t n : keys) {
          q.emplace_back(size_t(H * (dk + 1))), kv.emplace_back(size_t(n * ld));
          for (auto* a : {&q.back(), &kv.back()})
            for (float& x : *a) x = rng.normal();
          got.emplace_back(size_t(H * dv)), want.emplace_back(size_t(H * dv)), alone.emplace_back(size_t(H * dv));
        }
        for (size_t i = 0; i < keys.size(); ++i) {
          qs.push_back({q[i].data(), dk + 1, keys[i], kv[i].data(), ld, got[i].data(), dv});
          LatentQuery r = qs.back();
          r.out = want[i].data();
          ref_qs.push_back(r);
        }
        const float scale = 1.0f / std::sqrt(float(dk));
        latent_attention(qs, H, dk, dv, scale);
        ref::latent_attention(ref_qs, H, dk, dv, scale);
        for (size_t i = 0; i < keys.size(); ++i) {
          LatentQuery one = qs[i];
          one.out = alone[i].data();
          latent_attention({&one, 1}, H, dk, dv, scale);
          EXPECT_EQ(got[i], alone[i]) << "query " << i << " H " << H << " threads " << threads;
          double num = 0, den = 0;
          for (size_t j = 0; j < got[i].size(); ++j)
            num += (got[i][j] - want[i][j]) * (got[i][j] - want[i][j]), den += want[i][j] * want[i][j];
          EXPECT_LE(std::sqrt(num / den), 1e-5) << "query " << i << " dk " << dk << " H " << H;
        }
      }
  set_threads(0);
}

}  // namespace
}  // namespace attention_test
}  // namespace lineage::kernels
