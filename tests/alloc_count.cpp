// The test binary's operator new: malloc, counted (the workspace test asserts that a warm step makes
// no allocation at all, not only none that touches a new page). In a file of its own, where no
// container code is inlined beside the replacement (GCC 12 would see the standard new in it).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "test_support.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

int64_t lineage::test::allocations() { return g_allocations.load(std::memory_order_relaxed); }

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
