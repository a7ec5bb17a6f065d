#include "lineage/io/mapping_guard.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace lineage::io {

namespace {

// Fixed storage, so the signal handler reads it without locks or allocation. A slot is free while
// `begin` is 0; its path and end are written before begin is published.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  uintptr_t end = 0;
  char path[512] = {};
};
constexpr int kSlots = 1024;  // more shards than any checkpoint has
Slot g_slots[kSlots];

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Slot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    if (b == 0 || at < b || at >= s.end) continue;
    write_all("lineage: error: ");
    write_all(s.path);
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
  for (Slot& s : g_slots) {
    if (s.begin.load(std::memory_order_relaxed) != 0) continue;
    const size_t n = std::min(path.size(), sizeof s.path - 1);
    std::memcpy(s.path, path.data(), n);
    s.path[n] = '\0';
    s.end = reinterpret_cast<uintptr_t>(begin) + bytes;
    s.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    return;
  }
}

void forget_mapping(const void* begin) {
  for (Slot& s : g_slots)
    if (s.begin.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(begin)) s.begin.store(0);
}

void install_mapping_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace lineage::io
