// Shared by the libFuzzer harnesses: a scratch directory per process (the parsers read files, so
// each input is written to one there first), file writing, splitting an input into sections, and
// the harnesses' own invariant checks, which abort so that libFuzzer keeps the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::fuzz {

// A fresh directory for this process, under $LINEAGE_FUZZ_SCRATCH if set, else /dev/shm where it
// exists; removed at a normal exit.
const std::filesystem::path& scratch_dir();

void write_file(const std::filesystem::path& path, std::string_view bytes);
inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
}

// Writes tensors in order as a .safetensors file (header padded to 8 bytes, contiguous data).
void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors);

// The input split at each "\n@@@@\n" (the seeds' file separator); at least one section.
std::vector<std::string_view> split_sections(std::string_view input);
inline constexpr std::string_view kSectionSeparator = "\n@@@@\n";

// Called with each expected rejection; prints its message when LINEAGE_FUZZ_VERBOSE is set (to see
// which seeds load: LINEAGE_FUZZ_VERBOSE=1 build-asan/fuzz/fuzz_npy fuzz/corpus/fuzz_npy/*).
void rejected(const std::exception& e);

// A harness invariant the parser's result broke: prints `what` and aborts (libFuzzer saves the input).
[[noreturn]] void violated(const std::string& what);

}  // namespace lineage::fuzz
