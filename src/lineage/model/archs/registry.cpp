#include <map>

#include "lineage/model/archs/arch.h"

namespace lineage::model {

namespace {
const std::map<std::string, ArchBuilder>& registry() {
  static const std::map<std::string, ArchBuilder> r = {
      {"gpt2", build_gpt2},
      {"linear_attn", build_linear_attn},
      {"delta_net", build_delta_net},
      {"gated_deltanet", build_gated_deltanet},
      {"kda", build_kda},
      {"kimi_linear", build_kimi_linear},
      {"kimi_k3", build_kimi_k3},
      {"qwen3_next", build_qwen3_next},
      {"qwen3_5", build_qwen3_5},
      {"qwen3_5_moe", build_qwen3_5_moe},
  };
  return r;
}
}  // namespace

const ArchBuilder* find_arch(const std::string& model_type) {
  const auto it = registry().find(model_type);
  return it == registry().end() ? nullptr : &it->second;
}

std::string known_model_types() {
  std::string s;
  for (const auto& [k, v] : registry()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace lineage::model
