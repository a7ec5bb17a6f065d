// A growing per-thread byte buffer seen through a 64-byte aligned pointer: the working space of the
// kernels' packed panels and prepared rows, reused from call to call (first-touch page faults cost
// more than the work on small inputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lineage {

inline void* aligned_scratch(std::vector<char>& buf, size_t bytes) {
  buf.resize(bytes + 64);
  return buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
}

}  // namespace lineage
