#include "lineage/model/archs/gguf_map.h"

#include <cmath>

#include "lineage/core/error.h"

namespace lineage::model {

namespace {
const std::map<std::string, GgufArchMap>& registry() {
  static const std::map<std::string, GgufArchMap> r = {
      {"gpt2", gguf_gpt2},
      {"kimi-linear", gguf_kimi_linear},
      {"kimi-k3", gguf_kimi_linear},
      {"qwen3next", gguf_qwen3_next},
      {"qwen35", gguf_qwen35},
      {"qwen35moe", gguf_qwen35moe},
  };
  return r;
}
}  // namespace

const GgufArchMap* find_gguf_arch(const std::string& arch) {
  const auto it = registry().find(arch);
  return it == registry().end() ? nullptr : &it->second;
}

std::string known_gguf_archs() {
  std::string s;
  for (const auto& [k, v] : registry()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

GgufTensorMap gguf_expert(const std::string& hf, const std::string& gguf, int64_t e) {
  GgufTensorMap m{hf, gguf, [e](const Tensor& x) { return x.rows(e, e + 1).reshaped({x.dim(1), x.dim(2)}); }};
  m.whole_rows = true;
  return m;
}

Tensor gguf_f32(const Tensor& t, const std::string& file, const std::string& name) {
  if (t.dtype() != DType::F32)
    throw Error(cat(file, ": tensor ", name, ": ", dtype_name(t.dtype()), "; expected F32 (as the converter writes it)"));
  return t;
}

Tensor a_log_from_minus_exp(const Tensor& stored, const std::string& file, const std::string& name) {
  Tensor out = gguf_f32(stored, file, name).clone();
  float* v = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (!(v[i] < 0.0f))
      throw Error(cat(file, ": tensor ", name, "[", i, "] = ", v[i], "; expected −exp(A_log), a negative number"));
    v[i] = std::log(-v[i]);
  }
  return out;
}

void GgufSource::fail(const std::string& key, const std::string& expected) const {
  const auto it = metadata->find(key);
  throw Error(cat(file, ": key ", key, ": expected ", expected,
                  it == metadata->end() ? std::string(", found no such key") : cat(", found ", it->dump())));
}

int64_t GgufSource::integer(const std::string& name, int64_t max) const {
  if (!has(arch + "." + name)) fail(arch + "." + name, cat("a whole number in [1, ", max, "]"));
  return integer(name, 0, max);
}

int64_t GgufSource::integer(const std::string& name, int64_t fallback, int64_t max) const {
  const std::string key = arch + "." + name;
  const auto it = metadata->find(key);
  if (it == metadata->end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > max)
    fail(key, cat("a whole number in [1, ", max, "]"));
  return it->get<int64_t>();
}

double GgufSource::number(const std::string& name, double fallback) const {
  const std::string key = arch + "." + name;
  const auto it = metadata->find(key);
  if (it == metadata->end()) return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>())) fail(key, "a finite number");
  return it->get<double>();
}

}  // namespace lineage::model
