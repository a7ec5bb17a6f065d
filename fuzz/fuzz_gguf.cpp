// One .gguf file through io::GgufFile: the header, the metadata (every value type, nested arrays),
// the tensor infos and the aligned data section. A file the parser accepts must have version 2 or 3,
// each key and tensor name once, a power-of-two alignment, every tensor's bytes (whole blocks of its
// ggml type) inside the data section at an aligned offset, no two overlapping, and readable end to end.
// An accepted file then goes through io::load_gguf (the architecture's map, the binding, the
// tokenizer from tokenizer.ggml.*): an Error naming the file, or a model whose every tensor is bound
// and a tokenizer that encodes and decodes (seeds: a 1-layer GPT-2 with a 260-token vocabulary, and
// one whose matrices and embedding are ggml blocks: Q8_0, Q4_0, Q5_0, Q5_1 and MXFP4). Every file also
// goes through io::gguf_header_model (`lineage info`: the header alone, the data may be missing): an
// Error naming the file, or a model; one that load_gguf accepts, with the same layers.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/io/gguf.h"
#include "lineage/io/gguf_model.h"

using namespace lineage;

namespace {

void check_accepted(const io::GgufFile& f, size_t size) {
  if (f.version() != 2 && f.version() != 3) fuzz::violated(cat("accepted version ", f.version()));
  if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0) fuzz::violated("a non-power-of-two alignment");
  std::set<std::string> keys, names;
  for (const io::GgufKv& kv : f.metadata())
    if (!keys.insert(kv.key).second) fuzz::violated(cat("key \"", kv.key, "\" twice"));
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const io::GgufTensor& t : f.tensors()) {
    if (!names.insert(t.name).second) fuzz::violated(cat("tensor \"", t.name, "\" twice"));
    const io::GgmlType* g = io::ggml_type(t.type);
    if (!g || t.ne.empty() || t.ne[0] % g->block != 0) fuzz::violated(cat("tensor \"", t.name, "\": type or dims"));
    if (t.offset % f.alignment() != 0) fuzz::violated(cat("tensor \"", t.name, "\": an unaligned offset"));
    if (f.data_offset() + t.offset + t.bytes > size) fuzz::violated(cat("tensor \"", t.name, "\" past the end"));
    uint64_t sum = 0;  // every byte readable
    const uint8_t* p = f.data(t);
    for (uint64_t i = 0; i < t.bytes; i += 4096) sum += p[i];
    if (t.bytes) sum += p[t.bytes - 1];
    (void)sum;
    spans.emplace_back(t.offset, t.offset + t.bytes);
  }
  fuzz::check_disjoint(spans);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "model.gguf";
  fuzz::write_file(path, data, size);
  size_t header_layers = 0;
  bool header_read = false;
  try {
    header_layers = io::gguf_header_model(path).model.blocks.size();
    header_read = true;
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  try {
    {
      const io::GgufFile f(path);
      check_accepted(f, size);
    }
    io::LoadedModel m = io::load_gguf(path);
    if (m.model.blocks.empty()) fuzz::violated("a model without layers");
    if (!header_read || header_layers != m.model.blocks.size()) fuzz::violated("a model its header alone reads otherwise");
    m.model.for_each_tensor([](const std::string& name, Tensor& t, const Shape& want, layers::Init) {
      if (t.shape() != want) fuzz::violated(cat("tensor ", name, " bound with another shape"));
    });
    if (m.tokenizer) {
      const std::vector<int32_t> ids = m.tokenizer->encode("Hello, the world!<|endoftext|>");
      for (int32_t id : ids)
        if (id < 0 || id >= m.tokenizer->vocab_size()) fuzz::violated(cat("token id ", id, " outside the vocabulary"));
      (void)m.tokenizer->decode(ids);
    }
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  return 0;
}
