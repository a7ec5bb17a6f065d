#include "lineage/io/mapping_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "lineage/core/error.h"

namespace lineage::io {

namespace {

// Fixed storage, so the signal handler reads it without locks or allocation. Slot i is free while
// g_begin[i] is 0; its end and path are written before its begin is published. The addresses sit
// apart from the paths so that a lookup touches two pages, not one per slot.
constexpr int kSlots = 256;  // more shards than any checkpoint has
std::atomic<uintptr_t> g_begin[kSlots];
uintptr_t g_end[kSlots];
char g_path[kSlots][512];

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= size_t(w);
  }
}

std::atomic<size_t> g_unmapped{0};

void on_sigbus(int sig, siginfo_t* info, void*) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kSlots; ++i) {
    const uintptr_t b = g_begin[i].load(std::memory_order_acquire);
    if (b == 0 || at < b || at >= g_end[i]) continue;
    write_all("lineage: error: ");
    write_all(g_path[i]);
    if (sig == SIGSEGV) {  // a page unmap_pages released: a read the split should never make
      char offset[32];
      int n = 0;
      for (uintptr_t v = at - b; n == 0 || v > 0; v /= 10) offset[n++] = char('0' + v % 10);
      char text[32];
      for (int j = 0; j < n; ++j) text[j] = offset[n - 1 - j];
      text[n] = '\0';
      write_all(": byte ");
      write_all(text);
      write_all(" was read, a part of a weight this rank released under tensor parallelism (its rows belong to "
                "another rank); this is a bug in lineage: please report it\n");
      ::_exit(2);
    }
    write_all(": the file changed while its weights were mapped (it shrank, or was rewritten in place); "
              "its pages can no longer be read. Reload the model after the file is complete, or load with "
              "--no-mmap to copy the weights at load\n");
    ::_exit(2);
  }
  // Not ours: the default action, as if no handler had been installed.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void remember_mapping(const void* begin, size_t bytes, const std::string& path) {
  for (int i = 0; i < kSlots; ++i) {
    if (g_begin[i].load(std::memory_order_relaxed) != 0) continue;
    const size_t n = std::min(path.size(), sizeof g_path[i] - 1);
    std::memcpy(g_path[i], path.data(), n);
    g_path[i][n] = '\0';
    g_end[i] = reinterpret_cast<uintptr_t>(begin) + bytes;
    g_begin[i].store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    return;
  }
}

void forget_mapping(const void* begin) {
  for (auto& b : g_begin)
    if (b.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(begin)) b.store(0);
}

std::optional<MappedAt> find_mapping(const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  for (int i = 0; i < kSlots; ++i) {
    const uintptr_t b = g_begin[i].load(std::memory_order_acquire);
    if (b != 0 && at >= b && at < g_end[i]) return MappedAt{g_path[i], uint64_t(at - b)};
  }
  return std::nullopt;
}

void install_mapping_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
}

size_t unmap_pages(const void* begin, size_t bytes) {
  if (!find_mapping(begin) || bytes == 0) return 0;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t z = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  if (z <= a || !find_mapping(reinterpret_cast<const void*>(z - 1))) return 0;
  if (::munmap(reinterpret_cast<void*>(a), z - a) != 0) return 0;
  // A read of the released pages, then, names the file (installed with the first release only, so
  // that other faults keep what handles them: the sanitizers' reports).
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGSEGV, &sa, nullptr) == 0;
  }();
  (void)installed;
  g_unmapped += z - a;
  return z - a;
}

size_t unmapped_bytes() { return g_unmapped.load(); }

std::shared_ptr<const void> map_readonly(const std::filesystem::path& path, size_t& size, const std::string& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(cat(path.string(), ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(cat(path.string(), ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(cat(path.string(), ": is not a regular file (", S_ISDIR(st.st_mode) ? "a directory" : "a device or pipe",
                    "); expected ", expected));
  }
  size = size_t(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw Error(cat(path.string(), ": file is empty; expected ", expected));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw Error(cat(path.string(), ": mmap failed: ", std::strerror(errno)));
  // Asks for 2 MiB pages: where the file system keeps large folios (ext4 and xfs on recent kernels),
  // pages read in through this mapping come as 2 MiB folios mapped by one entry each, so a decode
  // step's sweep over the weights neither misses the TLB every 4 KiB nor restarts the hardware
  // prefetcher at each page. Pages already cached in small folios stay as they are; where the
  // kernel cannot, the advice is ignored.
  (void)::madvise(p, size, MADV_HUGEPAGE);
  remember_mapping(p, size, path.string());
  return std::shared_ptr<const void>(p, [size](const void* q) {
    forget_mapping(q);
    ::munmap(const_cast<void*>(q), size);
  });
}

}  // namespace lineage::io
