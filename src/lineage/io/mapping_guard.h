// A checkpoint file that shrinks while its weights are mapped (truncated, or rewritten in place by a
// download or a copy) turns the next read of a page past its new end into SIGBUS. The registry below
// knows which file each mapping came from, so that signal becomes an error that names the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace lineage::io {

// Remembers [begin, begin + bytes) as mapped from `path`; forget_mapping(begin) when it is unmapped.
void remember_mapping(const void* begin, size_t bytes, const std::string& path);
void forget_mapping(const void* begin);

// The file a remembered mapping holds `p` from, and p's offset in it; nothing when p lies in none.
struct MappedAt {
  std::string path;
  uint64_t offset = 0;
};
std::optional<MappedAt> find_mapping(const void* p);

// Installs a SIGBUS handler: a fault inside a remembered mapping prints
// "lineage: error: FILE: ... changed while mapped ..." and exits with code 2; any other SIGBUS keeps
// the default action. unmap_pages adds a SIGSEGV handler: a read of pages it released prints
// "lineage: error: FILE: byte B was read, which this rank released ..." and exits with code 2.
void install_mapping_fault_handler();

// Unmaps the whole pages inside [begin, begin + bytes) of a remembered mapping (a rank's rows of a
// weight it never reads, under tensor parallelism): they leave the address space; the mapping's
// other pages stay. Returns the bytes unmapped (0 where the range holds no whole page or lies in no
// remembered mapping).
size_t unmap_pages(const void* begin, size_t bytes);
// The bytes unmap_pages has unmapped in this process.
size_t unmapped_bytes();

// `path` mapped read-only and remembered (unmapped and forgotten with the last reference), advised for
// 2 MiB pages; `size` set to its length. An Error names the file when it cannot be opened, is not a
// regular file or is empty (`expected`: what it should hold, for the message).
std::shared_ptr<const void> map_readonly(const std::filesystem::path& path, size_t& size, const std::string& expected);

}  // namespace lineage::io
