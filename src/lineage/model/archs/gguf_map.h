// GGUF architectures mapped back onto lineage's families. llama.cpp's converters rename a Hugging
// Face checkpoint's tensors, move its config.json into `ARCH.*` keys and transform some tensors
// (transposed, reshaped, split, stacked). A map undoes that: from the file's metadata it writes the
// config.json a Hugging Face checkpoint of the same model has, and it names, for each Hugging Face
// tensor, the GGUF tensor it comes from and how. The model is then built by the family's own builder
// (arch.h) and bound as a directory's would be (io/gguf_model.h reads the file and binds).
// One map per family, in the family's file; this header and gguf_map.cpp list them.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lineage/core/tensor.h"
#include "lineage/model/model.h"

namespace lineage::model {

// What a map reads: the file's metadata and its tensors' names and shapes (torch order: GGUF's dims
// reversed, the outermost first).
struct GgufSource {
  std::string file;                              // for messages
  std::string arch;                              // general.architecture
  const nlohmann::json* metadata = nullptr;      // key -> value, every key of the file
  std::map<std::string, Shape> tensors;

  bool has(const std::string& key) const { return metadata->contains(key); }
  // ARCH.name's value: required (an Error naming the file and key when absent or not a whole number
  // in [1, max]) or `fallback` when absent.
  int64_t integer(const std::string& name, int64_t max) const;
  int64_t integer(const std::string& name, int64_t fallback, int64_t max) const;
  double number(const std::string& name, double fallback) const;  // a finite number
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;
};

// One Hugging Face tensor: the GGUF tensor it is read from and, where the converter changed it, the
// inverse (a new tensor from the stored one; none: the stored tensor as it is, mapped).
struct GgufTensorMap {
  std::string hf, gguf;
  std::function<Tensor(const Tensor&)> convert;
  // A tensor the converter split in two (MLA's kv_b_proj): the second stored tensor, and how the two
  // (each converted first where `convert` says) make this one.
  std::string gguf2 = {};
  std::function<Tensor(const Tensor&, const Tensor&)> join = {};
  // `convert` only picks or moves whole rows (an expert's slice, value heads regrouped along dim 0), so
  // it runs on a block type's stored rows as they are; otherwise a block-quantized tensor is decoded to
  // f32 (its exact values) before `convert`.
  bool whole_rows = false;
};

// Expert e's [out, in] slice of a stacked [E, out, in] tensor, a view.
GgufTensorMap gguf_expert(const std::string& hf, const std::string& gguf, int64_t e);

struct GgufMapped {
  nlohmann::json config;               // as the family's config.json
  std::vector<GgufTensorMap> tensors;  // every GGUF tensor of the file is read by one of these
  // Changes to the built skeleton before binding (a GPT-2 file stores its matrices [out, in]).
  std::function<void(Model&)> adjust;
};

using GgufArchMap = GgufMapped (*)(const GgufSource&);

// What several converters store: the tensor as it is, if F32 (an Error naming the file and tensor
// otherwise); A_log from the stored −exp(A_log), log(−a) (−exp of it gives a back within an ulp; a value
// that is not negative is an Error naming the element).
Tensor gguf_f32(const Tensor& t, const std::string& file, const std::string& name);
Tensor a_log_from_minus_exp(const Tensor& stored, const std::string& file, const std::string& name);

const GgufArchMap* find_gguf_arch(const std::string& arch);  // general.architecture's value
std::string known_gguf_archs();                              // "gpt2, ..." for error messages

GgufMapped gguf_gpt2(const GgufSource& in);
GgufMapped gguf_qwen3_next(const GgufSource& in);
GgufMapped gguf_qwen35(const GgufSource& in);
GgufMapped gguf_qwen35moe(const GgufSource& in);
GgufMapped gguf_kimi_linear(const GgufSource& in);

}  // namespace lineage::model
