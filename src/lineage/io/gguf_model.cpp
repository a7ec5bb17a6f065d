#include "lineage/io/gguf_model.h"

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/model/archs/gguf_map.h"

namespace lineage::io {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_gguf(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

namespace {

// The element types lineage binds as they are stored.
std::optional<DType> plain_dtype(uint32_t type) {
  switch (type) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 30: return DType::BF16;
    default: return std::nullopt;
  }
}

Shape torch_shape(const GgufTensor& t) { return Shape(t.ne.rbegin(), t.ne.rend()); }

const json* key(const GgufFile& f, const std::string& name) {
  const GgufKv* kv = f.find(name);
  return kv ? &kv->value : nullptr;
}

[[noreturn]] void bad_key(const GgufFile& f, const std::string& name, const std::string& expected) {
  throw Error(cat(f.path().string(), ": key ", name, ": expected ", expected));
}

std::vector<std::string> strings(const GgufFile& f, const std::string& name, bool required) {
  const json* v = key(f, name);
  if (!v) {
    if (required) bad_key(f, name, "an array of strings, found no such key");
    return {};
  }
  if (!v->is_array()) bad_key(f, name, "an array of strings");
  std::vector<std::string> out;
  out.reserve(v->size());
  for (const json& e : *v) {
    if (!e.is_string()) bad_key(f, name, "an array of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<int32_t> token_id(const GgufFile& f, const std::string& name) {
  const json* v = key(f, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > INT32_MAX)
    bad_key(f, name, "a token id");
  return int32_t(v->get<int64_t>());
}

}  // namespace

std::optional<tokenizer::Tokenizer> gguf_tokenizer(const GgufFile& f) {
  const json* model = key(f, "tokenizer.ggml.model");
  if (!model) return std::nullopt;
  if (!model->is_string()) bad_key(f, "tokenizer.ggml.model", "a string");
  tokenizer::VocabTables t;
  t.source = f.path().string();
  t.model = model->get<std::string>();
  if (t.model == "no_vocab") return std::nullopt;
  const json* pre = key(f, "tokenizer.ggml.pre");
  if (pre && !pre->is_string()) bad_key(f, "tokenizer.ggml.pre", "a string");
  t.pre = pre ? pre->get<std::string>() : "default";
  t.tokens = strings(f, "tokenizer.ggml.tokens", true);
  t.merges = strings(f, "tokenizer.ggml.merges", false);
  if (const json* types = key(f, "tokenizer.ggml.token_type")) {
    if (!types->is_array()) bad_key(f, "tokenizer.ggml.token_type", "an array of integers");
    for (const json& e : *types) {
      if (!e.is_number_integer()) bad_key(f, "tokenizer.ggml.token_type", "an array of integers");
      t.types.push_back(int32_t(e.get<int64_t>()));
    }
  }
  t.bos = token_id(f, "tokenizer.ggml.bos_token_id");
  t.eos = token_id(f, "tokenizer.ggml.eos_token_id");
  t.pad = token_id(f, "tokenizer.ggml.padding_token_id");
  if (const json* add = key(f, "tokenizer.ggml.add_bos_token")) {
    if (!add->is_boolean()) bad_key(f, "tokenizer.ggml.add_bos_token", "a boolean");
    t.add_bos = add->get<bool>();
  }
  return tokenizer::Tokenizer::from_tables(t);
}

LoadedModel load_gguf(const fs::path& path, bool with_tokenizer, WeightStorage storage) {
  auto file = std::make_shared<GgufFile>(path);
  const std::string where = path.string();
  const json* arch_value = key(*file, "general.architecture");
  if (!arch_value || !arch_value->is_string()) bad_key(*file, "general.architecture", "a string naming the architecture");
  const std::string arch = arch_value->get<std::string>();
  const model::GgufArchMap* map = model::find_gguf_arch(arch);
  if (!map)
    throw Error(cat(where, ": key general.architecture: \"", arch, "\" is not an architecture lineage runs; it runs ",
                    model::known_gguf_archs()));

  json metadata = json::object();
  for (const GgufKv& kv : file->metadata()) metadata[kv.key] = kv.value;
  model::GgufSource src;
  src.file = where;
  src.arch = arch;
  src.metadata = &metadata;
  std::map<std::string, const GgufTensor*> by_name;
  for (const GgufTensor& t : file->tensors()) {
    by_name[t.name] = &t;
    src.tensors[t.name] = torch_shape(t);
  }
  const model::GgufMapped mapped = (*map)(src);

  std::map<std::string, std::pair<TensorEntry, Tensor>> held;
  std::set<std::string> read;
  for (const model::GgufTensorMap& m : mapped.tensors) {
    const auto it = by_name.find(m.gguf);
    if (it == by_name.end())
      throw Error(cat(where, ": tensor ", m.gguf, " is missing (", arch, " needs it for ", m.hf, ")"));
    const GgufTensor& t = *it->second;
    const std::optional<DType> dtype = plain_dtype(t.type);
    if (!dtype) {
      const GgmlType* type = ggml_type(t.type);
      throw Error(cat(where, ": tensor ", t.name, ": type ", type ? type->name : cat("#", t.type),
                      ", which lineage does not compute on yet; it reads F32, F16 and BF16 tensors"));
    }
    const uint8_t* data = file->data(t);
    Tensor view = Tensor::borrow(*dtype, torch_shape(t), data, std::shared_ptr<const void>(file, data));
    if (reinterpret_cast<uintptr_t>(data) % dtype_size(*dtype) != 0) view = view.clone();
    if (m.convert) view = m.convert(view);
    TensorEntry e{view.dtype(), view.shape(), size_t(file->data_offset() + t.offset),
                  size_t(file->data_offset() + t.offset + t.bytes), where};
    if (!held.emplace(m.hf, std::make_pair(e, view)).second)
      throw Error(cat(where, ": ", arch, "'s map names ", m.hf, " twice"));
    read.insert(m.gguf);
  }
  for (const GgufTensor& t : file->tensors())
    if (!read.count(t.name))
      throw Error(cat(where, ": tensor ", t.name, " is not one lineage's ", arch,
                      " reads (llama.cpp's optional tensors are applied or refused by name; this one is unknown)"));

  auto ckpt = std::make_shared<Checkpoint>(Checkpoint::of_tensors(std::move(held)));
  LoadedModel out = load_checkpoint(mapped.config, cat(where, " (its ", arch, ".* keys)"), ckpt, where, storage,
                                    mapped.adjust);
  out.dir = path;
  if (with_tokenizer) out.tokenizer = gguf_tokenizer(*file);
  return out;
}

}  // namespace lineage::io
