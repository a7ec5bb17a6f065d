#include "lineage/runtime/split_check.h"

#include <cmath>

#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/runtime/session.h"

namespace lineage::runtime {

std::vector<int32_t> split_check_tokens(int64_t vocab, int64_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(count));
  for (auto& x : t) x = int32_t(rng.next_u64() % uint64_t(vocab));
  return t;
}

double relative_rms(std::span<const float> got, std::span<const float> want) {
  LINEAGE_CHECK(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double prefill_decode_rel_rms(const model::Model& m, std::span<const int32_t> tokens) {
  const size_t V = size_t(m.config.vocab_size);
  Session whole(m), step(m);
  const auto all = whole.prefill(tokens, true);
  std::vector<float> decoded;
  decoded.reserve(tokens.size() * V);
  for (int32_t t : tokens) {
    const auto l = step.decode(t);
    decoded.insert(decoded.end(), l.begin(), l.end());
  }
  return relative_rms(decoded, all);
}

}  // namespace lineage::runtime
