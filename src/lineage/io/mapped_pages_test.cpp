// mapped_pages: the smaps fields of the mappings that hold given addresses, from a written smaps text
// and from this process's own mapping of a file.
#include "lineage/io/mapped_pages.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace lineage::io {
namespace mapped_pages_test {
namespace {

// Two mappings of a file and one anonymous one; the fields are made up.
constexpr const char* kSmaps =
    "7f0000000000-7f0000400000 r--p 00000000 fe:01 1234                       /data/model.safetensors\n"
    "Size:               4096 kB\n"
    "Rss:                3072 kB\n"
    "FilePmdMapped:      2048 kB\n"
    "VmFlags: rd mr mw me hg\n"
    "7f0000400000-7f0000600000 r--p 00400000 fe:01 1234                       /data/model.safetensors\n"
    "Rss:                 512 kB\n"
    "FilePmdMapped:         0 kB\n"
    "7f1000000000-7f1000200000 rw-p 00000000 00:00 0 \n"
    "Rss:                2048 kB\n"
    "FilePmdMapped:      2048 kB\n";

TEST(MappedPages, SumsTheMappingsThatHoldTheAddresses) {
  const auto at = [](std::vector<uintptr_t> a) {
    std::istringstream in(kSmaps);
    return mapped_pages(a, in);
  };
  const MappedPages first = at({0x7f0000000000, 0x7f00003fffff});  // two addresses, one mapping
  EXPECT_EQ(first.resident, size_t(3072) << 10);
  EXPECT_EQ(first.huge, size_t(2048) << 10);
  const MappedPages both = at({0x7f0000100000, 0x7f0000400000});  // the second starts where the first ends
  EXPECT_EQ(both.resident, size_t(3584) << 10);
  EXPECT_EQ(both.huge, size_t(2048) << 10);
  const MappedPages none = at({0x7f0000600000, 0x7f2000000000});  // past each mapping's end
  EXPECT_EQ(none.resident, 0u);
  EXPECT_EQ(none.huge, 0u);
}

// This process's own read-only mapping of a small file: its one page is in memory once read, and a
// mapping smaller than 2 MiB cannot have a 2 MiB entry.
TEST(MappedPages, ReadsThisProcessesMappings) {
  char path[] = "/tmp/lineage-mapped-pages-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  const std::string text(4096, 'x');
  ASSERT_EQ(write(fd, text.data(), text.size()), ssize_t(text.size()));
  void* p = mmap(nullptr, text.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<const volatile char*>(p)[100], 'x');
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const MappedPages got = mapped_pages(std::vector<uintptr_t>{a});
  EXPECT_EQ(got.resident, 4096u);
  EXPECT_EQ(got.huge, 0u);
  munmap(p, text.size());
  EXPECT_EQ(mapped_pages(std::vector<uintptr_t>{a}).resident, 0u);  // unmapped: no mapping holds it
}

}  // namespace
}  // namespace mapped_pages_test
}  // namespace lineage::io
