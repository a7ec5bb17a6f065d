#include "lineage/core/hash.h"

#include <cstdio>

namespace lineage {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Hasher::hex() const { return hex64(value()); }

}  // namespace lineage
