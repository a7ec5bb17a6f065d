// A 64-bit hash for checksums and fingerprints (state files, model identity): FNV-1a's multiply over
// 8-byte little-endian words, the tail bytes zero-padded into one last word with the length mixed
// in, and MurmurHash3's finalizer. Streaming: any split of the same bytes gives the same value. Not
// cryptographic; it detects corruption and tells models apart, it does not authenticate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lineage {

class Hasher {
 public:
  Hasher& add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    while (n > 0 && fill_ > 0) {  // complete the pending word first
      pending_[fill_++] = *p++, --n;
      if (fill_ == 8) word(pending_), fill_ = 0;
    }
    for (; n >= 8; p += 8, n -= 8) word(p);
    if (n > 0) std::memcpy(pending_, p, n);  // p may be null when n is 0 (an empty vector's data())
    fill_ = n;
    return *this;
  }
  Hasher& add(std::string_view s) { return add(s.data(), s.size()); }
  uint64_t value() const {
    uint64_t h = h_;
    if (fill_ > 0) {
      unsigned char last[8] = {};
      std::memcpy(last, pending_, fill_);
      h = mix(h, load(last));
    }
    h = mix(h, uint64_t(total_));
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull, h ^= h >> 33;
    return h;
  }
  std::string hex() const;  // 16 lowercase hex digits

 private:
  static uint64_t load(const unsigned char* p) {
    uint64_t w = 0;
    for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];  // little-endian on every host
    return w;
  }
  static uint64_t mix(uint64_t h, uint64_t w) { return (h ^ w) * 0x100000001b3ull; }
  void word(const unsigned char* p) { h_ = mix(h_, load(p)); }
  uint64_t h_ = 0xcbf29ce484222325ull;
  unsigned char pending_[8] = {};
  size_t fill_ = 0, total_ = 0;
};

inline uint64_t hash64(std::string_view s) { return Hasher().add(s).value(); }
std::string hex64(uint64_t v);

}  // namespace lineage
