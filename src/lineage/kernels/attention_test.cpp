// Tiled online-softmax attention against the naive ref:: twin, with queries packed [T, H, hd] and
// read in place from wider rows (as from a fused q | k | v projection).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/kernels/attention.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"

namespace lineage::kernels {
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

}  // namespace
}  // namespace lineage::kernels
