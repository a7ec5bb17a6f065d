// Typed reads of config.json fields with errors that name the file, the field, the value found and
// what was expected. Every size is range-checked here, before anything is allocated from it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace lineage::model {

// The largest value each kind of config.json size may take: far above every published model, far
// below what would make a count of blocks, a weight's byte length or a workspace overflow. A
// checkpoint's tensors bound the real sizes further when they are bound.
namespace limits {
constexpr int64_t kLayers = 4096;
constexpr int64_t kWidth = int64_t(1) << 20;      // model, FFN, head and low-rank widths
constexpr int64_t kHeads = int64_t(1) << 16;
constexpr int64_t kVocab = int64_t(1) << 24;      // the tokenizers' id bound too
constexpr int64_t kPositions = int64_t(1) << 31;  // a context limit
constexpr int64_t kConvSize = 1024;
}  // namespace limits

class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& j, std::string file) : j_(j), file_(std::move(file)) {}

  const nlohmann::json& json() const { return j_; }
  const std::string& file() const { return file_; }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  // An integer in [1, max]: required, or `fallback` when null or absent.
  int64_t integer(const std::string& key, int64_t max) const;
  int64_t integer(const std::string& key, int64_t fallback, int64_t max) const;
  // An integer in [0, max] (a count that may be none), or `fallback` when null or absent.
  int64_t count(const std::string& key, int64_t fallback, int64_t max) const;
  // A token id in [0, vocab); nothing when null; `fallback` when absent (the family's published
  // default), unless that lies outside the vocabulary.
  std::optional<int32_t> token_id(const std::string& key, int64_t vocab, std::optional<int32_t> fallback) const;
  // A finite number in (0, max], or `fallback` when null or absent.
  double positive(const std::string& key, double fallback, double max) const;
  // A finite number in [min, 0), or `fallback` when null or absent.
  double negative(const std::string& key, double fallback, double min) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  int64_t whole_number(const std::string& key, int64_t fallback, int64_t min, int64_t max) const;

  const nlohmann::json& j_;
  std::string file_;
};

}  // namespace lineage::model
