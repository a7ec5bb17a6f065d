#include "lineage/io/gguf.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "lineage/core/checked.h"
#include "lineage/core/error.h"
#include "lineage/io/mapping_guard.h"

namespace lineage::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr GgmlType kTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},       {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},       {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},  {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},         {28, "F64", 1, 8},         {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
};

constexpr int kMaxArrayDepth = 8;   // arrays of arrays of ... deeper than any file holds
constexpr size_t kMaxName = 64;     // the longest tensor name the GGUF spec allows
constexpr uint32_t kMaxDims = 4;    // GGML_MAX_DIMS

// A bounds-checked reader over [p, end): every read names what it was reading when it runs out.
class Reader {
 public:
  Reader(const uint8_t* begin, const uint8_t* end, const std::string& file) : p_(begin), begin_(begin), end_(end), file_(file) {}
  size_t left() const { return size_t(end_ - p_); }
  uint64_t at() const { return uint64_t(p_ - begin_); }
  [[noreturn]] void fail(const std::string& what, const std::string& expected) const {
    throw Error(cat(file_, ": ", what, " (at byte ", at(), "): expected ", expected));
  }
  template <class T>
  T get(const std::string& what) {
    if (left() < sizeof(T)) fail(what, cat(sizeof(T), " more bytes; the file ends"));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& what, uint64_t max_len) {
    const uint64_t n = get<uint64_t>(what + " (its length)");
    if (n > left()) fail(what, cat("a string of ", n, " bytes within the ", left(), " the file has left"));
    if (n > max_len) fail(what, cat("at most ", max_len, " bytes, found a length of ", n));
    std::string s(reinterpret_cast<const char*>(p_), size_t(n));
    p_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* begin_;
  const uint8_t* end_;
  std::string file_;
};

// The smallest number of bytes an element of `type` takes (to bound an array's length by the file).
uint64_t min_bytes(uint32_t type) {
  switch (GgufType(type)) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: case GgufType::String: return 8;
    case GgufType::Array: return 12;
  }
  return 1;
}

json read_value(Reader& r, uint32_t type, const std::string& what, int depth, uint32_t* element_type) {
  switch (GgufType(type)) {
    case GgufType::U8: return r.get<uint8_t>(what);
    case GgufType::I8: return r.get<int8_t>(what);
    case GgufType::U16: return r.get<uint16_t>(what);
    case GgufType::I16: return r.get<int16_t>(what);
    case GgufType::U32: return r.get<uint32_t>(what);
    case GgufType::I32: return r.get<int32_t>(what);
    case GgufType::F32: return r.get<float>(what);
    case GgufType::U64: return r.get<uint64_t>(what);
    case GgufType::I64: return r.get<int64_t>(what);
    case GgufType::F64: return r.get<double>(what);
    case GgufType::Bool: {
      const uint8_t b = r.get<uint8_t>(what);
      if (b > 1) r.fail(what, cat("a bool (0 or 1), found ", int(b)));
      return b == 1;
    }
    case GgufType::String: return r.string(what, uint64_t(1) << 40);
    case GgufType::Array: {
      if (depth >= kMaxArrayDepth) r.fail(what, cat("arrays nested at most ", kMaxArrayDepth, " deep"));
      const uint32_t et = r.get<uint32_t>(what + " (its element type)");
      if (et > uint32_t(GgufType::F64)) r.fail(what, cat("an element type 0 .. 12, found ", et));
      const uint64_t n = r.get<uint64_t>(what + " (its length)");
      if (n > r.left() / min_bytes(et))
        r.fail(what, cat("an array of ", n, " ", gguf_type_name(et), " values within the ", r.left(), " bytes left"));
      if (element_type) *element_type = et;
      json a = json::array();
      for (uint64_t i = 0; i < n; ++i) a.push_back(read_value(r, et, cat(what, "[", i, "]"), depth + 1, nullptr));
      return a;
    }
  }
  r.fail(what, cat("a value type 0 .. 12, found ", type));
}

}  // namespace

const char* gguf_type_name(uint32_t type) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  return type <= 12 ? names[type] : "?";
}

const GgmlType* ggml_type(uint32_t id) {
  for (const GgmlType& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

const GgufKv* GgufFile::find(const std::string& key) const {
  for (const GgufKv& kv : kvs_)
    if (kv.key == key) return &kv;
  return nullptr;
}

const uint8_t* GgufFile::data(const GgufTensor& t) const {
  if (header_only_) throw Error(cat(path_.string(), ": tensor \"", t.name, "\": the file was read for its header alone"));
  return base_ + data_offset_ + t.offset;
}

GgufFile::GgufFile(const fs::path& path, GgufRead read) : path_(path), header_only_(read == GgufRead::HeaderOnly) {
  size_t size = 0;
  map_ = map_readonly(path, size, "a GGUF file (magic \"GGUF\", version, counts, metadata, tensor infos, data)");
  base_ = static_cast<const uint8_t*>(map_.get());
  const std::string file = path.string();
  Reader r(base_, base_ + size, file);
  if (size < 4 || std::memcmp(base_, "GGUF", 4) != 0)
    throw Error(cat(file, ": not a GGUF file: expected the magic \"GGUF\" in its first 4 bytes"));
  (void)r.get<uint32_t>("magic");
  version_ = r.get<uint32_t>("the version");
  if (version_ != 2 && version_ != 3)
    throw Error(cat(file, ": GGUF version ", version_, "; expected 2 or 3 (version 1 files predate 64-bit counts)"));
  const uint64_t n_tensors = r.get<uint64_t>("the tensor count"), n_kv = r.get<uint64_t>("the metadata count");
  if (n_kv > r.left() / 13) r.fail("the metadata count", cat("at most ", r.left() / 13, " entries in ", r.left(), " bytes, found ", n_kv));
  std::set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    kv.key = r.string(cat("metadata entry ", i, "'s key"), 1 << 16);
    if (!keys.insert(kv.key).second) r.fail(cat("metadata key \"", kv.key, "\""), "each key once; it comes twice");
    kv.type = r.get<uint32_t>(cat("metadata \"", kv.key, "\"'s type"));
    kv.value = read_value(r, kv.type, cat("metadata \"", kv.key, "\""), 0, &kv.element_type);
    kvs_.push_back(std::move(kv));
  }
  if (const GgufKv* a = find("general.alignment")) {
    if (a->type != uint32_t(GgufType::U32) || a->value.get<uint64_t>() == 0 ||
        (a->value.get<uint64_t>() & (a->value.get<uint64_t>() - 1)) != 0)
      throw Error(cat(file, ": metadata \"general.alignment\" is ", a->value.dump(), " (", gguf_type_name(a->type),
                      "); expected a u32 power of two"));
    alignment_ = a->value.get<uint64_t>();
  }
  if (n_tensors > r.left() / 24) r.fail("the tensor count", cat("at most ", r.left() / 24, " tensors in ", r.left(), " bytes, found ", n_tensors));
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.string(cat("tensor ", i, "'s name"), kMaxName);
    const std::string what = cat("tensor \"", t.name, "\"");
    if (!names.insert(t.name).second) r.fail(what, "each tensor name once; it comes twice");
    const uint32_t dims = r.get<uint32_t>(what + "'s dims");
    if (dims == 0 || dims > kMaxDims) r.fail(what, cat("1 .. ", kMaxDims, " dims, found ", dims));
    int64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = r.get<uint64_t>(what + "'s dim");
      const std::optional<int64_t> m = n > uint64_t(INT64_MAX) ? std::nullopt : checked_mul(numel, int64_t(n));
      if (!m) r.fail(what, cat("dims whose product fits in 63 bits, found a dim of ", n));
      numel = *m;
      t.ne.push_back(int64_t(n));
    }
    t.type = r.get<uint32_t>(what + "'s type");
    const GgmlType* g = ggml_type(t.type);
    if (!g) r.fail(what, cat("a ggml type id lineage knows (F32, F16, BF16, Q4_0 ... Q8_0, Q2_K ... Q8_K, IQ*, TQ*, MXFP4), found ", t.type));
    if (t.ne[0] % g->block != 0)
      r.fail(what, cat("rows of whole ", g->name, " blocks (", g->block, " values each), found a row of ", t.ne[0]));
    t.bytes = uint64_t(numel / g->block) * uint64_t(g->bytes);
    t.offset = r.get<uint64_t>(what + "'s offset");
    if (t.offset % alignment_ != 0) r.fail(what, cat("an offset that is a multiple of the alignment ", alignment_, ", found ", t.offset));
    tensors_.push_back(std::move(t));
  }
  data_offset_ = (r.at() + alignment_ - 1) / alignment_ * alignment_;
  // Read for its header alone, the data may be absent: the tensors need only fit in 64 bits.
  const uint64_t data = header_only_ ? UINT64_MAX - data_offset_ : data_offset_ <= size ? size - data_offset_ : 0;
  if (!header_only_ && data_offset_ > size && !tensors_.empty())
    throw Error(cat(file, ": the data section starts past the end of the file"));
  // Every tensor inside the data, no two overlapping.
  std::vector<std::pair<uint64_t, const GgufTensor*>> spans;
  for (const GgufTensor& t : tensors_) {
    if (t.offset > data || t.bytes > data - t.offset)
      throw Error(cat(file, ": tensor \"", t.name, "\" (", ggml_type(t.type)->name, ", ", t.bytes, " bytes at offset ", t.offset,
                      ") runs past the end of the data section (", data, " bytes): the file is truncated or damaged"));
    spans.emplace_back(t.offset, &t);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i - 1].first + spans[i - 1].second->bytes > spans[i].first)
      throw Error(cat(file, ": tensors \"", spans[i - 1].second->name, "\" and \"", spans[i].second->name, "\" overlap in the data"));
}

}  // namespace lineage::io
