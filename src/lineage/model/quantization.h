// Which weight matrices a checkpoint stores quantized, and how: config.json's quantization_config read
// as compressed-tensors (config_groups with their targets, ignore, format per group or for the whole
// model) and transformers' native fp8 write it (spec quantized-formats.md §2), applied to a model's
// matrices by name before its tensors are bound, and checked against the tensors present.
#pragma once

#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "lineage/kernels/matrix.h"
#include "lineage/model/archs/config_fields.h"

namespace lineage::model {

struct Model;

struct QuantPlan {
  // A module pattern: an exact name, a `re:` regular expression (matched from the start of the module
  // name, as Python's re.match), or a class name ("Linear": every weight matrix).
  struct Pattern {
    std::string text;
    enum class Kind : uint8_t { Name, Regex, Class, Substring } kind = Kind::Name;
    std::regex re = {};
    bool matches(const std::string& module) const;
    // A compressed-tensors ignore or target entry ("name", "re:PATTERN", "Linear"); an Error naming
    // `field` when the pattern is no regular expression or names a class other than Linear.
    static Pattern parse(const std::string& text, const std::string& field);
  };
  struct Group {
    std::string field;  // "quantization_config.config_groups.group_0", for messages
    std::vector<Pattern> targets;
    kernels::StoredQuant stored;  // kind None with mxfp4
    bool mxfp4 = false;           // mxfp4-pack-quantized: Matrix::packed
  };
  std::string method;  // "compressed-tensors", "fp8", or empty (no quantization_config)
  std::vector<Group> groups;
  std::vector<Pattern> ignore;
  // What the config describes that the exact path does not use (activation schemes, a KV cache
  // scheme), one line each for `info`.
  std::vector<std::string> ignored;
  // The MXFP4 of the original K3 configs (format only, no config_groups): the family marks its
  // routed experts itself (kimi_linear.cpp).
  bool family_decides = false;

  bool empty() const { return groups.empty(); }
  // The group that quantizes module `module` (a matrix's name without ".weight"), or null.
  const Group* group_for(const std::string& module) const;
  // One line: "compressed-tensors pack-quantized int4 group 128 symmetric (Linear; ignore lm_head, ...)".
  std::string describe() const;
};

// quantization_config of the config.json at `cfg` (absent: an empty plan). Throws Error naming the
// field for an unknown method, format, strategy or bit width, activation order (weight_g_idx), and
// dynamic weights.
QuantPlan parse_quantization(const ConfigFields& cfg);

// Sets each matrix's stored layout from the plan (Matrix::quant, or Matrix::packed for MXFP4); where the
// family marks its own MXFP4 matrices (ModelConfig::family_packs_mxfp4), only adds those the files
// store packed. With
// `has_tensor` (a checkpoint), checks every matrix against the tensors present: a matrix the plan
// quantizes stored as a plain `weight`, or one it leaves alone stored packed, is an Error naming the
// tensor and the config field.
void apply_quantization(Model& m, const QuantPlan& plan, const std::function<bool(const std::string&)>& has_tensor,
                        const std::string& where);

// Every bound quantized matrix made ready for the kernels (kernels::prepare_quant); errors name `where`.
void prepare_quantized(Model& m, const std::string& where);

// Switches the int8-activation mode (kernels::QuantWeight::int8_dot, linear.h) on or off for every
// prepared quantized matrix of m; returns how many of them have int4 or int8 codes (the others, FP8
// and FP4, always run exact).
int64_t set_int8_dot(Model& m, bool on);

}  // namespace lineage::model
