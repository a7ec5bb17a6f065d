// The test binary's operator new: malloc, counted (the workspace test asserts that a warm step makes
// no allocation at all, not only none that touches a new page). In a file of its own, where no
// container code is inlined beside the replacement (GCC 12 would see the standard new in it).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "test_support.h"

// Not under AddressSanitizer, whose own operator new (aligned, nothrow) would meet this delete.
#if defined(__SANITIZE_ADDRESS__)
#define LINEAGE_COUNT_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LINEAGE_COUNT_NEW 0
#endif
#endif
#ifndef LINEAGE_COUNT_NEW
#define LINEAGE_COUNT_NEW 1
#endif

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

int64_t lineage::test::allocations() { return LINEAGE_COUNT_NEW ? g_allocations.load(std::memory_order_relaxed) : -1; }

#if LINEAGE_COUNT_NEW
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
#endif
