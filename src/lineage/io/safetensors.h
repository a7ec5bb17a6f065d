// safetensors files, memory-mapped and validated strictly; single files and sharded checkpoints
// (model.safetensors.index.json). Tensors are borrowed views into the mapping, never copies.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::io {

struct TensorEntry {
  DType dtype;
  Shape shape;
  size_t begin = 0, end = 0;  // byte offsets within the data section
  std::string file;           // the file that holds it
};

// One mapped .safetensors file. Throws Error naming the file and what is wrong: header length past
// the end, malformed JSON, unknown dtype, offsets out of bounds, unsorted or overlapping, byte
// length that does not match shape × dtype size.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const std::map<std::string, TensorEntry>& entries() const { return entries_; }
  Tensor tensor(const std::string& name) const;  // borrowed view; keeps the mapping alive
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::shared_ptr<const void> map_;
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorEntry> entries_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json (a name in two shards, or an index entry missing from its shard, is
// an error).
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);
  // A checkpoint of tensors held elsewhere under the names a directory's would have (a GGUF file's
  // tensors, mapped back: io/gguf_model.h). Each entry's file and byte range say where it came from.
  static Checkpoint of_tensors(std::map<std::string, std::pair<TensorEntry, Tensor>> tensors);
  // of_tensors: replaces a held tensor (the GGUF loader's decoded block tensors that bind as no matrix).
  void replace_held(const std::string& name, Tensor t);
  bool has(const std::string& name) const { return where_.count(name) > 0 || held_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;
  Tensor tensor(const std::string& name) const;
  std::vector<std::string> names() const;
  size_t file_bytes() const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name → index into files_
  std::map<std::string, std::pair<TensorEntry, Tensor>> held_;  // of_tensors: no files
};

// One .safetensors file written a tensor at a time (a checkpoint larger than memory, lineage quantize):
// the header from the declared layout first, then each tensor's bytes in that order.
class SafetensorsWriter {
 public:
  struct Layout {
    std::string name;
    DType dtype;
    Shape shape;
  };
  SafetensorsWriter(const std::filesystem::path& path, const std::vector<Layout>& layout,
                    const std::map<std::string, std::string>& metadata = {});
  // The next declared tensor's bytes (shape × dtype size of them).
  void write(const std::string& name, const void* data, size_t bytes);
  // Every declared tensor written; flushed and closed. Throws Error naming the file on failure.
  void close();

 private:
  std::filesystem::path path_;
  std::vector<Layout> layout_;
  size_t next_ = 0;
  std::ofstream out_;
};

// Writes `tensors` in order as one .safetensors file: the header padded with spaces to 8 bytes, the
// data contiguous. Throws Error naming the file when it cannot be written.
void save_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors);

}  // namespace lineage::io
