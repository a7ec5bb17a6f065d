#include "lineage/io/mapped_pages.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace lineage::io {

MappedPages mapped_pages(std::span<const uintptr_t> addresses, std::istream& smaps) {
  MappedPages pages;
  bool holds = false;  // whether the current mapping holds one of the addresses
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    size_t kb = 0;
    char key[64];
    // A mapping's header ("lo-hi perms offset dev inode path") has its first ':' (in dev) after a
    // space; a field line ("Rss:   12 kB") before one.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      const auto it = std::lower_bound(addresses.begin(), addresses.end(), uintptr_t(lo));
      holds = it != addresses.end() && *it < hi;
    } else if (holds && std::sscanf(line.c_str(), "%63[^:]: %zu kB", key, &kb) == 2) {
      if (std::strcmp(key, "Rss") == 0) pages.resident += kb << 10;
      if (std::strcmp(key, "FilePmdMapped") == 0) pages.huge += kb << 10;
    }
  }
  return pages;
}

MappedPages mapped_pages(std::span<const uintptr_t> addresses) {
  std::ifstream smaps("/proc/self/smaps");
  return smaps ? mapped_pages(addresses, smaps) : MappedPages{};
}

}  // namespace lineage::io
