#include "lineage/io/stream_files.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "lineage/core/error.h"

namespace lineage::io {

void check_unchanged(const std::string& path, int fd, const struct stat& at_load, const std::string& what) {
  struct stat now {};
  if (::fstat(fd, &now) != 0 || now.st_size != at_load.st_size || now.st_mtim.tv_sec != at_load.st_mtim.tv_sec ||
      now.st_mtim.tv_nsec != at_load.st_mtim.tv_nsec)
    throw Error(cat(path, ": the file changed while lineage streamed ", what, " from it (size ", at_load.st_size,
                    " at load, ", now.st_size, " now, or a new modification time); reload the model"));
}

SequentialRead read_sequentially(const std::vector<int>& fds, uint64_t max_bytes) {
  constexpr size_t kChunk = 4 << 20, kPage = 4096;
  void* p = std::aligned_alloc(kPage, kChunk);
  if (!p) throw Error("disk roofline: out of memory");
  const std::unique_ptr<void, void (*)(void*)> chunk(p, std::free);
  SequentialRead r;
  const auto t0 = std::chrono::steady_clock::now();
  for (const int fd : fds)
    for (uint64_t at = 0; r.bytes < max_bytes;) {
      const ssize_t n = ::pread(fd, p, kChunk, off_t(at));
      if (n <= 0) break;
      at += uint64_t(n), r.bytes += uint64_t(n);
    }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rate = s > 0 ? double(r.bytes) / s : 0;
  return r;
}

}  // namespace lineage::io
