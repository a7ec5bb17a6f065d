#include "lineage/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "lineage/core/checked.h"
#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/io/mapping_guard.h"

namespace lineage::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// More dims than any tensor has; a longer list is a crafted header.
constexpr size_t kMaxRank = 16;

Shape parse_shape(const json& j, const std::string& where) {
  if (!j.is_array()) throw Error(cat(where, ": \"shape\" must be an array of non-negative integers"));
  if (j.size() > kMaxRank) throw Error(cat(where, ": \"shape\" has ", j.size(), " dims; expected at most ", kMaxRank));
  Shape s;
  for (const auto& d : j) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      throw Error(cat(where, ": \"shape\" must be an array of non-negative integers, found ", d.dump()));
    s.push_back(d.get<int64_t>());
  }
  return s;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  const std::string f = path.string();
  size_t size = 0;
  map_ = map_readonly(path, size, "a safetensors file (an 8-byte header length, the header, the data)");
  const char* base = static_cast<const char*>(map_.get());
  if (size < 8) throw Error(cat(f, ": file has ", size, " bytes; expected at least the 8-byte header length"));
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > size - 8)
    throw Error(cat(f, ": header length ", header_len, " runs past the end of the file (", size,
                    " bytes); the file is truncated or not safetensors"));
  const json header = parse_json(std::string_view(base + 8, header_len), cat(f, ": header"));
  if (!header.is_object()) throw Error(cat(f, ": header must be a JSON object, found ", header.type_name()));
  data_ = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;

  std::vector<std::pair<size_t, std::string>> order;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = cat(f, ": tensor \"", name, "\"");
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw Error(cat(where, ": expected an object with dtype, shape and data_offsets"));
    if (!e["dtype"].is_string()) throw Error(cat(where, ": \"dtype\" must be a string"));
    const std::string dt = e["dtype"].get<std::string>();
    const auto dtype = dtype_from_name(dt);
    if (!dtype)
      throw Error(cat(where, ": dtype \"", dt, "\" is not supported; expected one of F64, F32, F16, BF16, I64, ",
                      "I32, I16, I8, U8, BOOL, F8_E4M3"));
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(cat(where, ": \"data_offsets\" must be [begin, end] with non-negative integers"));
    TensorEntry t{*dtype, parse_shape(e["shape"], where), off[0].get<size_t>(), off[1].get<size_t>(), f};
    if (t.begin > t.end || t.end > data_size)
      throw Error(cat(where, ": data_offsets [", t.begin, ", ", t.end, "] are outside the data section of ",
                      data_size, " bytes"));
    const auto expected = checked_nbytes(t.shape, t.dtype);
    if (!expected)
      throw Error(cat(where, ": shape ", shape_str(t.shape), " of ", dt, " has more bytes than 2^63; the header is ",
                      "damaged or crafted"));
    if (t.end - t.begin != uint64_t(*expected))
      throw Error(cat(where, ": holds ", t.end - t.begin, " bytes but shape ", shape_str(t.shape), " of ", dt,
                      " needs ", *expected));
    order.emplace_back(t.begin, name);
    entries_.emplace(name, std::move(t));
  }
  // The data section must be covered in order, each tensor starting where the previous one ends.
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : entries_.at(a.second).end < entries_.at(b.second).end;
  });
  size_t cursor = 0;
  for (const auto& [begin, name] : order) {
    const TensorEntry& t = entries_.at(name);
    if (begin < cursor)
      throw Error(cat(f, ": tensor \"", name, "\" at bytes [", t.begin, ", ", t.end,
                      "] overlaps the tensor before it (which ends at ", cursor, ")"));
    if (begin > cursor)
      throw Error(cat(f, ": bytes [", cursor, ", ", begin, ") before tensor \"", name,
                      "\" belong to no tensor; offsets must be contiguous"));
    cursor = t.end;
  }
  if (cursor != data_size)
    throw Error(cat(f, ": the data section has ", data_size, " bytes but the tensors cover ", cursor,
                    "; the file has trailing bytes or a wrong header"));
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto it = entries_.find(name);
  LINEAGE_CHECK(it != entries_.end(), "no tensor ", name, " in ", path_.string());
  const TensorEntry& e = it->second;
  const Tensor view = Tensor::borrow(e.dtype, e.shape, data_ + e.begin, map_);
  // The format does not promise alignment (the header's length is free); kernels load a dtype's
  // elements whole, so a misaligned tensor is copied once into aligned memory.
  if (reinterpret_cast<uintptr_t>(data_ + e.begin) % dtype_size(e.dtype) != 0) return view.clone();
  return view;
}

Checkpoint Checkpoint::open(const fs::path& dir) {
  Checkpoint c;
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  std::vector<fs::path> files;
  json weight_map;
  // Every file-system query takes an error_code: a crafted name (longer than NAME_MAX, say) then
  // reads as a missing file, named in an Error, instead of a filesystem_error.
  std::error_code ec;
  if (fs::exists(index, ec)) {
    const json j = read_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(cat(index.string(), ": field \"weight_map\": expected an object of tensor name -> shard file"));
    weight_map = j["weight_map"];
    for (const auto& [name, file] : weight_map.items()) {
      if (!file.is_string())
        throw Error(cat(index.string(), ": weight_map[\"", name, "\"]: expected a file name string"));
      const std::string shard = file.get<std::string>();
      // A shard is a file beside the index, never a path that leaves the model directory.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw Error(cat(index.string(), ": weight_map[\"", name, "\"]: \"", shard,
                        "\" is not a file name in the model directory"));
      const fs::path p = dir / shard;
      if (std::find(files.begin(), files.end(), p) == files.end()) files.push_back(p);
    }
  } else if (fs::exists(single, ec)) {
    files.push_back(single);
  } else {
    throw Error(cat(dir.string(), ": no model.safetensors or model.safetensors.index.json found"));
  }
  for (const auto& p : files) {
    if (!fs::exists(p, ec))
      throw Error(cat(index.string(), ": names shard ", p.filename().string(), " which does not exist",
                      ec ? cat(" (", ec.message(), ")") : std::string()));
    c.files_.push_back(std::make_shared<SafetensorsFile>(p));
    for (const auto& [name, e] : c.files_.back()->entries()) {
      if (c.where_.count(name))
        throw Error(cat(p.string(), ": tensor \"", name, "\" is also in ", c.files_[c.where_[name]]->path().string()));
      c.where_[name] = c.files_.size() - 1;
    }
  }
  for (const auto& [name, file] : weight_map.items()) {
    const auto it = c.where_.find(name);
    if (it == c.where_.end() || c.files_[it->second]->path().filename() != file.get<std::string>())
      throw Error(cat(index.string(), ": weight_map says \"", name, "\" is in ", file.get<std::string>(),
                      " but that shard does not hold it"));
  }
  return c;
}

Checkpoint Checkpoint::of_tensors(std::map<std::string, std::pair<TensorEntry, Tensor>> tensors) {
  Checkpoint c;
  c.held_ = std::move(tensors);
  return c;
}

void Checkpoint::replace_held(const std::string& name, Tensor t) {
  const auto it = held_.find(name);
  LINEAGE_CHECK(it != held_.end(), "replace_held: no held tensor ", name);
  it->second.first.dtype = t.dtype();
  it->second.first.shape = t.shape();
  it->second.second = std::move(t);
}

const TensorEntry& Checkpoint::entry(const std::string& name) const {
  if (const auto it = held_.find(name); it != held_.end()) return it->second.first;
  return files_[where_.at(name)]->entries().at(name);
}

Tensor Checkpoint::tensor(const std::string& name) const {
  if (const auto it = held_.find(name); it != held_.end()) return it->second.second;
  return files_[where_.at(name)]->tensor(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : where_) n.push_back(k);
  for (const auto& [k, v] : held_) n.push_back(k);
  return n;
}

size_t Checkpoint::file_bytes() const {
  size_t n = 0;
  std::set<std::string> held_files;
  for (const auto& [k, v] : held_) held_files.insert(v.first.file);
  std::error_code ec;
  for (const auto& f : held_files) {
    const auto size = fs::file_size(f, ec);
    if (!ec) n += size;
  }
  for (const auto& f : files_) {
    const auto size = fs::file_size(f->path(), ec);
    if (!ec) n += size;
  }
  return n;
}

SafetensorsWriter::SafetensorsWriter(const fs::path& path, const std::vector<Layout>& layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), layout_(layout), out_(path, std::ios::binary | std::ios::trunc) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t at = 0;
  for (const Layout& l : layout) {
    const size_t bytes = size_t(shape_numel(l.shape)) * dtype_size(l.dtype);
    header[l.name] = {{"dtype", std::string(dtype_name(l.dtype))}, {"shape", l.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t len = h.size();
  out_.write(reinterpret_cast<const char*>(&len), 8);
  out_ << h;
  if (!out_) throw Error(cat(path.string(), ": cannot write"));
}

void SafetensorsWriter::write(const std::string& name, const void* data, size_t bytes) {
  LINEAGE_CHECK(next_ < layout_.size() && layout_[next_].name == name, "SafetensorsWriter: ", name, " out of order");
  const Layout& l = layout_[next_++];
  LINEAGE_CHECK(bytes == size_t(shape_numel(l.shape)) * dtype_size(l.dtype), "SafetensorsWriter: ", name, " holds ",
                bytes, " bytes");
  out_.write(static_cast<const char*>(data), std::streamsize(bytes));
  if (!out_) throw Error(cat(path_.string(), ": cannot write (", name, ")"));
}

void SafetensorsWriter::close() {
  LINEAGE_CHECK(next_ == layout_.size(), "SafetensorsWriter: ", layout_.size() - next_, " tensors not written");
  out_.close();
  if (!out_) throw Error(cat(path_.string(), ": cannot write"));
}

void save_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<SafetensorsWriter::Layout> layout;
  for (const auto& [name, t] : tensors) layout.push_back({name, t.dtype(), t.shape()});
  SafetensorsWriter w(path, layout);
  for (const auto& [name, t] : tensors) w.write(name, t.raw(), t.nbytes());
  w.close();
}

}  // namespace lineage::io
