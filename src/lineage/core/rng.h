// Seeded, platform-independent random numbers (SplitMix64 + Box-Muller), so a preset built with
// --seed S has the same weights on every machine.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace lineage {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // The whole generator state, to continue a stream elsewhere (a state file) exactly.
  struct Snapshot {
    uint64_t state = 0;
    float spare = 0.0f;
    bool has_spare = false;
  };
  explicit Rng(const Snapshot& s) : state_(s.state), spare_(s.spare), has_spare_(s.has_spare) {}
  Snapshot snapshot() const { return {state_, spare_, has_spare_}; }
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  // Box-Muller, both outputs used.
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
    spare_ = float(r * std::sin(a));
    has_spare_ = true;
    return float(r * std::cos(a));
  }

 private:
  uint64_t state_;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

// n token ids uniform in [0, vocab) from `seed` (prompts for benchmarks, checks and tests).
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng.next_u64() % uint64_t(vocab));
  return t;
}

}  // namespace lineage
