// Shared by the libFuzzer harnesses: a scratch directory per process (the parsers read files, so
// each input is written to one there first), file writing, splitting an input into sections, loading
// with expected rejections, made-up token ids, a UTF-8 check, and the harnesses' own invariant
// checks, which abort so that libFuzzer keeps the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lineage/core/error.h"
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

// Calls violated() where two of the byte ranges [begin, end) overlap (sorts them).
void check_disjoint(std::vector<std::pair<uint64_t, uint64_t>>& spans);

// What `load()` returns, or nullopt where it throws an Error (passed to rejected). Only the load is
// guarded: an Error from checking its result afterwards is a finding, not a rejection.
template <class F>
auto load_or_reject(F load) -> std::optional<decltype(load())> {
  try {
    return load();
  } catch (const Error& e) {
    rejected(e);
    return std::nullopt;
  }
}

// Ids as a user might pass them to `lineage detokenize --tokens`: one from each of the first 64
// bytes of `text`, spread over [-1, vocab + 1], so out of range, holes and all.
inline std::vector<int32_t> ids_from_bytes(std::string_view text, int32_t vocab) {
  std::vector<int32_t> ids;
  for (unsigned char c : text.substr(0, 64)) ids.push_back(int32_t(c) * 7919 % (vocab + 3) - 1);
  return ids;
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF);
// written here apart from the library's decoder so that it checks that decoder.
inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(n);
  }
  return true;
}

}  // namespace lineage::fuzz
