#include "fuzz_support.h"

#include "lineage/io/safetensors.h"

#include <algorithm>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace lineage::fuzz {

namespace fs = std::filesystem;

namespace {
fs::path make_scratch_dir() {
  // libFuzzer ends a timed run with _Exit, past the atexit below, so fuzz/run.sh names a root it removes.
  const char* env = std::getenv("LINEAGE_FUZZ_SCRATCH");
  const fs::path root = env && *env                       ? fs::path(env)
                        : fs::is_directory("/dev/shm") ? fs::path("/dev/shm")
                                                        : fs::temp_directory_path();
  const fs::path dir = root / ("lineage_fuzz_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
}  // namespace

const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path d = make_scratch_dir();
    std::atexit([] { std::error_code ec; fs::remove_all(scratch_dir(), ec); });
    return d;
  }();
  return dir;
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) violated("cannot write the scratch file " + path.string());
}

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  io::save_safetensors(path, tensors);
}

std::vector<std::string_view> split_sections(std::string_view input) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t at = input.find(kSectionSeparator);
    out.push_back(input.substr(0, at));
    if (at == std::string_view::npos) return out;
    input.remove_prefix(at + kSectionSeparator.size());
  }
}

void rejected(const std::exception& e) {
  static const bool verbose = std::getenv("LINEAGE_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "lineage fuzz: rejected: %s\n", e.what());
}

void check_disjoint(std::vector<std::pair<uint64_t, uint64_t>>& spans) {
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) violated("accepted overlapping tensors");
}

void violated(const std::string& what) {
  std::fprintf(stderr, "lineage fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace lineage::fuzz
