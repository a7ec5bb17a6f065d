// How the kernel holds mapped memory: of the mappings that contain given addresses, the bytes in
// memory and those mapped by 2 MiB entries (file pages that came in as 2 MiB folios). A checkpoint's
// weights are mapped from its files; the rest of a mapping sits in 4 KiB pages, a TLB miss and a
// restart of the hardware prefetchers each, which decode notices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <span>

namespace lineage::io {

struct MappedPages {
  size_t resident = 0, huge = 0;  // bytes
};

// Sums the `Rss` and `FilePmdMapped` fields of every mapping in `smaps` (the format of
// /proc/<pid>/smaps) that contains at least one of `addresses` (sorted ascending).
MappedPages mapped_pages(std::span<const uintptr_t> addresses, std::istream& smaps);
// The same for this process; zeros where /proc/self/smaps cannot be read.
MappedPages mapped_pages(std::span<const uintptr_t> addresses);

}  // namespace lineage::io
