// Shared helpers of the test binary: where the generated reference data lives, error metrics, and
// running the built `lineage` command.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace lineage::test {

// $LINEAGE_TESTDATA (written by the reference fixtures); fails the test when unset or missing.
std::filesystem::path testdata();
// $LINEAGE_BIN, the built lineage executable.
std::string lineage_bin();
std::filesystem::path source_dir();
// A file's whole contents ("" when it cannot be read).
std::string slurp(const std::filesystem::path& p);
// A fresh empty directory under the system temp dir, unique per test.
std::filesystem::path temp_dir();

// Calls of the global operator new in this process so far (the test binary replaces it to count);
// -1 under AddressSanitizer, which keeps its own.
int64_t allocations();

// ‖a − b‖₂ / ‖b‖₂ (relative RMS), in double.
double rel_rms(const float* a, const float* b, int64_t n);
// Index of the element with the largest absolute difference.
int64_t worst_index(const float* a, const float* b, int64_t n);

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs `lineage <args>` (args is a shell-quoted string) and captures stdout, stderr and exit code.
RunResult run_lineage(const std::string& args);
std::string shell_quote(const std::string& s);

}  // namespace lineage::test

#include <initializer_list>
#include <utility>

#include <nlohmann/json_fwd.hpp>

#include "lineage/core/tensor.h"

namespace lineage::test {

// A reference case's golden token ids (DIR/golden/tokens.npy) as `lineage logits --tokens` takes them.
std::string golden_tokens_arg(const std::filesystem::path& dir);
// Writes tensors in order to a .safetensors file (header padded to 8 bytes, contiguous data).
void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors);
// Writes raw bytes: an 8-byte header length, the header text, then `data`.
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header, const std::string& data,
                           int64_t header_len_override = -1);
// A tiny GPT-2 directory (2 layers, width 16, vocab 50, 32 positions) with seeded weights in `dtype`;
// `edit` may change the tensor list before it is written.
std::filesystem::path tiny_gpt2_dir(
    DType dtype = DType::F32,
    const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit = nullptr);
void write_text(const std::filesystem::path& path, const std::string& text);

using TensorList = std::vector<std::pair<std::string, Tensor>>;
// A GPT-2-vocabulary model (1 layer, width 16, 64 positions, EOS 50256) next to the real GPT-2
// tokenizer files; `edit_config` and `edit_tensors` may change config.json and the weights before
// they are written.
std::filesystem::path tiny_model_with_tokenizer(const std::function<void(nlohmann::json&)>& edit_config = {},
                                                const std::function<void(TensorList&)>& edit_tensors = {});

// A fresh directory holding `config` as config.json and nothing else (a published config alone).
std::filesystem::path write_config(const nlohmann::json& config);
// `config` is refused: io::load_skeleton throws an Error that names config.json and holds every one
// of `pieces`, and `lineage info` on it exits non-zero with the first piece in its message.
void expect_config_error(const nlohmann::json& config, std::initializer_list<std::string> pieces);

}  // namespace lineage::test
