// Built-in architectures with seeded random weights: no file needed, same weights on every machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lineage/model/model.h"

namespace lineage::model {

struct Preset {
  std::string name;         // "gpt2-124m"
  std::string summary;      // one line
  std::string config_json;  // the config.json the family's builder reads
  bool in_tour = false;     // one preset per architecture appears in `lineage tour`
};

const std::vector<Preset>& presets();
std::string preset_names();  // for error messages and --help

// Builds the preset's skeleton only (shapes, names, configs; no weights allocated).
Model preset_skeleton(const std::string& name);

// Builds the preset with weights ~ N(0, 0.02) (norm weights 1, biases 0) in `dtype`, seeded so the
// same (name, seed) gives the same weights everywhere. Throws Error on an unknown name.
Model make_preset(const std::string& name, uint64_t seed, DType dtype);

// Fills every tensor of `m` with seeded random values in `dtype` (allocating them).
void init_random(Model& m, uint64_t seed, DType dtype);

}  // namespace lineage::model
