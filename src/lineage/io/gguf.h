// GGUF files, llama.cpp's format (ggml's docs/gguf.md; spec: shared/spec/quantized-formats.md §3.1):
// the header (versions 2 and 3), every metadata value type (arrays nested too), the tensor infos
// (dims innermost first, ggml's type ids) and the aligned data, mapped. Every count, length, size and
// offset is checked against the file before it is used, so a damaged or crafted file is an Error that
// names the file, the key or tensor, and what was expected; never a read past the mapping.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace lineage::io {

// GGUF's metadata value types.
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9, U64 = 10,
  I64 = 11, F64 = 12,
};
const char* gguf_type_name(uint32_t type);  // "u8", ..., "array"; "?" for an unknown id

// One metadata entry: its type, for an array the type of its elements, and the value as JSON
// (numbers, booleans, strings; arrays as JSON arrays, nested ones nested).
struct GgufKv {
  std::string key;
  uint32_t type = 0, element_type = 0;
  nlohmann::json value;
};

// ggml's tensor types as stored: a block of `block` elements in `bytes` bytes (1 and the element size
// for the plain types).
struct GgmlType {
  uint32_t id;
  const char* name;
  int64_t block, bytes;
};
const GgmlType* ggml_type(uint32_t id);  // nullptr for an id ggml does not (or no longer) define

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // dims, innermost first (a torch [out, in] matrix is ne = {in, out})
  uint32_t type = 0;
  uint64_t offset = 0;      // from the start of the data section
  uint64_t bytes = 0;
};

// What a GgufFile needs of its file: all of it (the tensors' data checked to lie inside), or the
// header alone (`lineage info`: the metadata and tensor infos; the data may be absent, and data()
// refuses to hand it out).
enum class GgufRead : uint8_t { Whole, HeaderOnly };

class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path, GgufRead read = GgufRead::Whole);
  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // of the data section, in the file
  const std::vector<GgufKv>& metadata() const { return kvs_; }
  const GgufKv* find(const std::string& key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // The bytes of a tensor (tensors()[i]), inside the mapping. Throws for a file read HeaderOnly.
  const uint8_t* data(const GgufTensor& t) const;
  // What keeps the mapping alive (a tensor borrowed from data() holds it).
  const std::shared_ptr<const void>& mapping() const { return map_; }

 private:
  std::filesystem::path path_;
  std::shared_ptr<const void> map_;
  const uint8_t* base_ = nullptr;
  uint32_t version_ = 0;
  bool header_only_ = false;
  uint64_t alignment_ = 32, data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensor> tensors_;
};

}  // namespace lineage::io
