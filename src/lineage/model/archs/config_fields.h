// Typed reads of config.json fields with errors that name the file, the field and what was expected.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace lineage::model {

class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& j, std::string file) : j_(j), file_(std::move(file)) {}

  const nlohmann::json& json() const { return j_; }
  const std::string& file() const { return file_; }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t integer(const std::string& key) const;                     // required, > 0
  int64_t integer(const std::string& key, int64_t fallback) const;   // null or absent → fallback
  std::optional<int64_t> optional_integer(const std::string& key) const;
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json& j_;
  std::string file_;
};

}  // namespace lineage::model
