// Checkpoint families: each maps its config.json and tensor names onto the model's LayerSpecs.
// One file per family in this folder; this registry is the only list of them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lineage/model/archs/config_fields.h"
#include "lineage/model/model.h"

namespace lineage::model {

struct ArchInput {
  ConfigFields config;
  // Whether the checkpoint holds a tensor of this name (lets a family pick prefixes and a tied or
  // separate head). Presets answer with what the family would write itself.
  std::function<bool(const std::string&)> has_tensor;
  // The stored shape of a tensor the checkpoint holds (empty when it does not, or for a preset).
  std::function<Shape(const std::string&)> tensor_shape = [](const std::string&) { return Shape{}; };
};

// Builds the model's skeleton (shapes, names, configs; tensors still empty).
using ArchBuilder = Model (*)(const ArchInput&);

const ArchBuilder* find_arch(const std::string& model_type);
std::string known_model_types();  // "gpt2, ..." for error messages

Model build_gpt2(const ArchInput& in);
Model build_linear_attn(const ArchInput& in);
Model build_delta_net(const ArchInput& in);
Model build_gated_deltanet(const ArchInput& in);
Model build_kda(const ArchInput& in);
Model build_kimi_linear(const ArchInput& in);
Model build_kimi_k3(const ArchInput& in);
Model build_qwen3_next(const ArchInput& in);
Model build_qwen3_5(const ArchInput& in);
Model build_qwen3_5_moe(const ArchInput& in);

}  // namespace lineage::model
