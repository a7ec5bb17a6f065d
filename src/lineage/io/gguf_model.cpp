#include "lineage/io/gguf_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/layers/common.h"
#include "lineage/model/archs/gguf_map.h"
#include "lineage/model/binding.h"
#include "lineage/model/model.h"

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

// A tensor of ggml blocks (`data`, rows of whole blocks) as its values in f32, torch shape `values`.
Tensor decoded(const kernels::GgmlBlockInfo& b, const uint8_t* data, const Shape& values) {
  Tensor f = Tensor::empty(DType::F32, values);
  const int64_t n = values.back(), row_bytes = n / b.values * b.bytes;
  for (int64_t r = 0; r < f.numel() / std::max<int64_t>(1, n); ++r)
    kernels::ref::ggml_decode_row(b.block, data + r * row_bytes, n, f.data<float>() + r * n);
  return f;
}

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

// The files of a split model (llama.cpp's gguf-split: PREFIX-00001-of-0000N.gguf, the first holding
// the metadata, each split.no, split.count and split.tensors.count): the first's, then the others in
// order; a single file alone. A missing or mismatched split is an Error naming it.
std::vector<std::shared_ptr<GgufFile>> open_splits(const fs::path& path, GgufRead read) {
  std::vector<std::shared_ptr<GgufFile>> files{std::make_shared<GgufFile>(path, read)};
  const GgufFile& first = *files[0];
  const json* count = key(first, "split.count");
  if (!count) return files;
  if (!count->is_number_integer() || count->get<int64_t>() < 1 || count->get<int64_t>() > 9999)
    bad_key(first, "split.count", "a count of split files in [1, 9999]");
  const int64_t n = count->get<int64_t>();
  const auto number = [](const GgufFile& f) -> int64_t {
    const json* no = key(f, "split.no");
    if (!no || !no->is_number_integer()) bad_key(f, "split.no", "the file's index among the splits, from 0");
    return no->get<int64_t>();
  };
  if (number(first) != 0)
    throw Error(cat(path.string(), ": key split.no: ", number(first), "; expected 0 (pass the first split, -00001-of-",
                    n, ".gguf)"));
  if (n == 1) return files;
  const auto part = [n](int64_t i) {  // "-00002-of-00003.gguf" for the second of three
    char s[64];
    std::snprintf(s, sizeof s, "-%05lld-of-%05lld.gguf", (long long)(i + 1), (long long)n);
    return std::string(s);
  };
  const std::string name = path.filename().string(), tail = part(0);
  if (name.size() <= tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    throw Error(cat(path.string(), ": key split.count says ", n, " files; expected the first to be named PREFIX", tail));
  const std::string prefix = name.substr(0, name.size() - tail.size());
  int64_t tensors = int64_t(first.tensors().size());
  for (int64_t i = 1; i < n; ++i) {
    const fs::path next = path.parent_path() / (prefix + part(i));
    std::error_code ec;
    if (!fs::is_regular_file(next, ec))
      throw Error(cat(path.string(), ": split ", i + 1, " of ", n, ", ", next.string(), ", does not exist"));
    files.push_back(std::make_shared<GgufFile>(next, read));
    if (number(*files.back()) != i)
      throw Error(cat(next.string(), ": key split.no: ", number(*files.back()), "; expected ", i));
    tensors += int64_t(files.back()->tensors().size());
  }
  if (const json* total = key(first, "split.tensors.count"); total && (!total->is_number_integer() || total->get<int64_t>() != tensors))
    bad_key(first, "split.tensors.count", cat(tensors, ", the tensors the ", n, " files hold"));
  return files;
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

namespace {

// A GGUF file (and its splits) with its architecture's map applied: the Hugging Face config and the
// tensors each GGUF tensor becomes. Every GGUF tensor must be one the map reads.
struct MappedFile {
  std::vector<std::shared_ptr<GgufFile>> files;
  std::string arch;
  json metadata = json::object();
  model::GgufMapped mapped;
  std::map<std::string, std::pair<const GgufTensor*, std::shared_ptr<GgufFile>>> by_name;  // and its file
};

void open_mapped(MappedFile& out, const fs::path& path, GgufRead read) {
  out.files = open_splits(path, read);
  const GgufFile& file = *out.files[0];
  const std::string where = path.string();
  const json* arch_value = key(file, "general.architecture");
  if (!arch_value || !arch_value->is_string()) bad_key(file, "general.architecture", "a string naming the architecture");
  out.arch = arch_value->get<std::string>();
  const model::GgufArchMap* map = model::find_gguf_arch(out.arch);
  if (!map)
    throw Error(cat(where, ": key general.architecture: \"", out.arch, "\" is not an architecture lineage runs; it runs ",
                    model::known_gguf_archs()));
  for (const GgufKv& kv : file.metadata()) out.metadata[kv.key] = kv.value;
  model::GgufSource src;
  src.file = where;
  src.arch = out.arch;
  src.metadata = &out.metadata;
  for (const auto& f : out.files)
    for (const GgufTensor& t : f->tensors()) {
      if (!out.by_name.emplace(t.name, std::make_pair(&t, f)).second)
        throw Error(cat(f->path().string(), ": tensor ", t.name, " is also in ", out.by_name[t.name].second->path().string()));
      src.tensors[t.name] = torch_shape(t);
    }
  out.mapped = (*map)(src);
  std::set<std::string> read_names;
  for (const model::GgufTensorMap& m : out.mapped.tensors) read_names.insert({m.gguf, m.gguf2});
  for (const auto& entry : out.by_name)
    if (!read_names.count(entry.first))
      throw Error(cat(where, ": tensor ", entry.first, " is not one lineage's ", out.arch,
                      " reads (llama.cpp's optional tensors are applied or refused by name; this one is unknown)"));
}

}  // namespace

GgufHeaderModel gguf_header_model(const fs::path& path) {
  MappedFile f;
  open_mapped(f, path, GgufRead::HeaderOnly);
  std::map<std::string, const model::GgufTensorMap*> hf;
  for (const model::GgufTensorMap& m : f.mapped.tensors) hf.emplace(m.hf, &m);
  // A tensor's shape as stored (what a family reads of one, A_log's length, survives the converts).
  GgufHeaderModel out;
  out.model = build_model_from_config(
      f.mapped.config, cat(path.string(), " (its ", f.arch, ".* keys)"), [&](const std::string& n) { return hf.count(n) > 0; },
      [&](const std::string& n) { return hf.count(n) ? torch_shape(*f.by_name.at(hf.at(n)->gguf).first) : Shape{}; });
  if (f.mapped.adjust) f.mapped.adjust(out.model);
  std::map<std::string, uint64_t> by_type;
  for (const auto& [name, t] : f.by_name) {
    by_type[ggml_type(t.first->type)->name] += t.first->bytes;
    // llama.cpp's names for a layer's routed experts, stacked: blk.N.ffn_{gate,up,down,gate_up}_exps.*
    long long layer = -1;
    if (name.find("_exps.") != std::string::npos && std::sscanf(name.c_str(), "blk.%lld.", &layer) == 1 && layer >= 0 &&
        layer < (long long)out.model.blocks.size()) {
      out.routed_expert_bytes.resize(out.model.blocks.size());
      out.routed_expert_bytes[size_t(layer)] += t.first->bytes;
    }
  }
  out.bytes_by_type.assign(by_type.begin(), by_type.end());
  return out;
}

LoadedModel load_gguf(const fs::path& path, bool with_tokenizer, WeightStorage storage, const StreamOptions* stream) {
  MappedFile f;
  open_mapped(f, path, GgufRead::Whole);
  const std::shared_ptr<GgufFile>& file = f.files[0];
  const std::string where = path.string(), &arch = f.arch;
  const model::GgufMapped& mapped = f.mapped;
  const auto& by_name = f.by_name;

  std::map<std::string, std::pair<TensorEntry, Tensor>> held;
  // The Hugging Face tensors held as a block type's rows (U8 [..., rows, row bytes]): their format, and
  // the decoded f32 tensor should they bind as no matrix.
  struct Blocks {
    kernels::GgmlBlock type;
    Shape shape;  // the values' torch shape
  };
  std::map<std::string, Blocks> blocks;
  // A stored tensor as a view of the mapping (copied where misaligned for its type); `for_what` names
  // the Hugging Face tensor it is read for. A block type's tensor comes as its rows of bytes, or with
  // `decode` as its values in f32.
  const auto stored = [&](const std::string& name, const std::string& for_what,
                          bool decode) -> std::tuple<Tensor, TensorEntry, const kernels::GgmlBlockInfo*> {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw Error(cat(where, ": tensor ", name, " is missing (", arch, " needs it for ", for_what, ")"));
    const GgufTensor& t = *it->second.first;
    const std::shared_ptr<GgufFile>& in = it->second.second;
    const uint8_t* data = in->data(t);
    const TensorEntry e{DType::U8, {}, size_t(in->data_offset() + t.offset), size_t(in->data_offset() + t.offset + t.bytes),
                        in->path().string()};
    if (const std::optional<DType> dtype = plain_dtype(t.type)) {
      Tensor view = Tensor::borrow(*dtype, torch_shape(t), data, std::shared_ptr<const void>(in, data));
      if (reinterpret_cast<uintptr_t>(data) % dtype_size(*dtype) != 0) view = view.clone();
      return {view, e, nullptr};
    }
    const kernels::GgmlBlockInfo* b = kernels::ggml_block_of_type(t.type);
    if (!b) {
      const GgmlType* type = ggml_type(t.type);
      std::string known = "F32, F16, BF16";
      for (const kernels::GgmlBlockInfo& k : kernels::ggml_blocks()) known += cat(", ", k.name);
      throw Error(cat(where, ": tensor ", t.name, ": type ", type ? type->name : cat("#", t.type),
                      ", which lineage does not compute on; it reads ", known));
    }
    // The reader checked that dims[0] is whole blocks and the bytes lie in the file.
    const Shape values = torch_shape(t);
    if (decode) return {decoded(*b, data, values), e, b};
    Shape byte_shape = values;
    byte_shape.back() = t.ne[0] / b->values * b->bytes;
    return {Tensor::borrow(DType::U8, byte_shape, data, std::shared_ptr<const void>(in, data)), e, b};
  };
  for (const model::GgufTensorMap& m : mapped.tensors) {
    // A converted or joined tensor gets the values, unless the convert moves whole rows.
    const bool decode = (m.convert && !m.whole_rows) || !m.gguf2.empty();
    auto [view, e, block] = stored(m.gguf, m.hf, decode);
    if (m.convert) view = m.convert(view);
    if (!m.gguf2.empty()) {
      auto [second, e2, block2] = stored(m.gguf2, m.hf, true);
      if (m.convert) second = m.convert(second);
      view = m.join(view, second);
    }
    e.dtype = view.dtype();
    e.shape = view.shape();
    if (block && !decode) {
      Shape shape = view.shape();
      shape.back() = shape.back() / block->bytes * block->values;
      blocks.emplace(m.hf, Blocks{block->block, shape});
    }
    if (!held.emplace(m.hf, std::make_pair(e, view)).second)
      throw Error(cat(where, ": ", arch, "'s map names ", m.hf, " twice"));
  }
  auto ckpt = std::make_shared<Checkpoint>(Checkpoint::of_tensors(std::move(held)));
  // Block-quantized tensors that bind as weight matrices (the embedding and head included) stay blocks
  // (StoredQuant Ggml); the others are decoded to their f32 values.
  const auto adjust = [&](model::Model& m) {
    if (mapped.adjust) mapped.adjust(m);
    // The embedding and an untied head bind in their blocks too (model.h).
    if (blocks.count(m.names.embed)) m.embed_blocks.quant.kind = kernels::StoredQuant::Kind::Ggml;
    if (!m.config.tied_lm_head && blocks.count(m.names.lm_head)) m.head_blocks.quant.kind = kernels::StoredQuant::Kind::Ggml;
    std::set<std::string> claimed;
    m.for_each_tensor(layers::TensorVisitor::with_matrices([&](const std::string& param, kernels::Matrix& w) {
      std::string name = model::stored_matrix(m.binding, param);
      for (const model::BindingTable::Unstack& us : m.binding.unstacks)  // a slice of a stacked tensor held so
        if (const auto slot = model::unstack_slot(us, param); slot && blocks.count(slot->stored)) name = slot->stored;
      const auto it = blocks.find(name);
      if (it == blocks.end()) return;
      w.quant = kernels::StoredQuant{};
      w.quant.kind = kernels::StoredQuant::Kind::Ggml;
      w.quant.ggml = it->second.type;
      w.quant.origin = cat(where, ", tensor type ", kernels::ggml_block_info(it->second.type).name);
      w.packed = false;
      w.layout = kernels::Layout::OutIn;
      claimed.insert(name);
    }));
    for (const auto& [name, b] : blocks) {
      if (claimed.count(name)) continue;
      const Tensor rows = ckpt->tensor(name);
      ckpt->replace_held(name, decoded(kernels::ggml_block_info(b.type), static_cast<const uint8_t*>(rows.raw()), b.shape));
    }
  };
  LoadedModel out = load_checkpoint(mapped.config, cat(where, " (its ", arch, ".* keys)"), ckpt, where, storage, adjust, stream);
  out.dir = path;
  if (with_tokenizer) out.tokenizer = gguf_tokenizer(*file);
  if (const json* t = key(*file, "tokenizer.chat_template")) {
    if (!t->is_string()) bad_key(*file, "tokenizer.chat_template", "a string (a Jinja template)");
    EmbeddedChatTemplate c{t->get<std::string>(), cat(where, " key tokenizer.chat_template"), "", ""};
    if (out.tokenizer) {
      if (const auto bos = out.tokenizer->bos_id()) c.bos_token = out.tokenizer->token_bytes(*bos);
      if (const auto eos = out.tokenizer->eos_id()) c.eos_token = out.tokenizer->token_bytes(*eos);
    }
    out.chat_template = std::move(c);
  }
  return out;
}

}  // namespace lineage::io
