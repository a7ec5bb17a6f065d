#include "lineage/model/archs/config_fields.h"

#include <cmath>

#include "lineage/core/error.h"

namespace lineage::model {

void ConfigFields::fail(const std::string& key, const std::string& what) const {
  std::string found = j_.contains(key) ? j_[key].dump() : std::string("nothing");
  if (found.size() > 60) found = found.substr(0, 57) + "...";
  throw Error(cat(file_, ": field \"", key, "\": expected ", what, ", found ", found));
}

int64_t ConfigFields::integer(const std::string& key, int64_t max) const {
  if (!has(key)) fail(key, cat("an integer in [1, ", max, "]"));
  return integer(key, 1, max);
}

int64_t ConfigFields::integer(const std::string& key, int64_t fallback, int64_t max) const {
  return whole_number(key, fallback, 1, max);
}

int64_t ConfigFields::count(const std::string& key, int64_t fallback, int64_t max) const {
  return whole_number(key, fallback, 0, max);
}

int64_t ConfigFields::whole_number(const std::string& key, int64_t fallback, int64_t min, int64_t max) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  const std::string want = cat("an integer in [", min, ", ", max, "]");
  // 4096.0 is how some exporters write an integer; 4096.5 is not one.
  const bool whole = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                                v.get<double>() == std::floor(v.get<double>()));
  if (!whole) fail(key, want);
  if (v.is_number_unsigned() ? (v.get<uint64_t>() < uint64_t(min) || v.get<uint64_t>() > uint64_t(max))
      : v.is_number_integer() ? (v.get<int64_t>() < min || v.get<int64_t>() > max)
                              : (v.get<double>() < double(min) || v.get<double>() > double(max)))
    fail(key, want);
  return v.is_number_float() ? int64_t(v.get<double>()) : v.get<int64_t>();
}

std::optional<int32_t> ConfigFields::token_id(const std::string& key, int64_t vocab,
                                              std::optional<int32_t> fallback) const {
  if (!j_.contains(key)) return fallback && *fallback < vocab ? fallback : std::nullopt;
  if (j_[key].is_null()) return std::nullopt;
  const auto& v = j_[key];
  const std::string want = cat("a token id in [0, ", vocab, ") (vocab_size)");
  if (!v.is_number_integer()) fail(key, want);
  if (v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t(vocab) : (v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab))
    fail(key, want);
  return int32_t(v.get<int64_t>());
}

double ConfigFields::positive(const std::string& key, double fallback, double max) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0 || v.get<double>() > max)
    fail(key, cat("a finite number in (0, ", max, "]"));
  return v.get<double>();
}

double ConfigFields::negative(const std::string& key, double fallback, double min) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() >= 0 || v.get<double>() < min)
    fail(key, cat("a finite number in [", min, ", 0)"));
  return v.get<double>();
}

bool ConfigFields::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_boolean()) fail(key, "true or false");
  return j_[key].get<bool>();
}

std::string ConfigFields::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_string()) fail(key, "a string");
  return j_[key].get<std::string>();
}

}  // namespace lineage::model
