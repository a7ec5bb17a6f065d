#include "lineage/model/archs/config_fields.h"

#include "lineage/core/error.h"

namespace lineage::model {

void ConfigFields::fail(const std::string& key, const std::string& what) const {
  const std::string found = j_.contains(key) ? j_[key].dump() : std::string("nothing");
  throw Error(cat(file_, ": field \"", key, "\": expected ", what, ", found ", found));
}

std::optional<int64_t> ConfigFields::optional_integer(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const auto& v = j_[key];
  if (!v.is_number_integer()) fail(key, "an integer");
  return v.get<int64_t>();
}

int64_t ConfigFields::integer(const std::string& key) const {
  const auto v = optional_integer(key);
  if (!v) fail(key, "a positive integer");
  if (*v <= 0) fail(key, "a positive integer");
  return *v;
}

int64_t ConfigFields::integer(const std::string& key, int64_t fallback) const {
  const auto v = optional_integer(key);
  if (v && *v <= 0) fail(key, "a positive integer");
  return v.value_or(fallback);
}

double ConfigFields::number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_number()) fail(key, "a number");
  return j_[key].get<double>();
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
