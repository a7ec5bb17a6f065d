// A checkpoint file that shrinks while its weights are mapped (truncated, or rewritten in place by a
// download or a copy) turns the next read of a page past its new end into SIGBUS. The registry below
// knows which file each mapping came from, so that signal becomes an error that names the file.
#pragma once

#include <cstddef>
#include <string>

namespace lineage::io {

// Remembers [begin, begin + bytes) as mapped from `path`; forget_mapping(begin) when it is unmapped.
void remember_mapping(const void* begin, size_t bytes, const std::string& path);
void forget_mapping(const void* begin);

// Installs a SIGBUS handler: a fault inside a remembered mapping prints
// "lineage: error: FILE: ... changed while mapped ..." and exits with code 2; any other SIGBUS keeps
// the default action.
void install_mapping_fault_handler();

}  // namespace lineage::io
