// lineage gguf: what a GGUF file holds (io/gguf.h), as llama.cpp's gguf-dump shows it: the version,
// the metadata with their types, and the tensors with their ggml types, dims and bytes; --json for
// all of it as one object.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/io/gguf.h"

namespace lineage::app {

namespace {

// A value for the text listing: arrays by their length and first items, long strings cut.
std::string short_value(const io::GgufKv& kv) {
  const auto cut = [](std::string s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; };
  if (kv.value.is_array()) {
    std::string first;
    for (size_t i = 0; i < kv.value.size() && i < 4; ++i)
      first += (i ? ", " : "") + kv.value[i].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return cat("[", kv.value.size(), " x ", io::gguf_type_name(kv.element_type), "] ",
               cut(first + (kv.value.size() > 4 ? ", ..." : "")));
  }
  return cut(kv.value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

void add_gguf(CLI::App& app) {
  struct Opts {
    std::string file;
    bool json = false;
  };
  static Opts o;
  auto* cmd = app.add_subcommand("gguf", "list what a GGUF file holds: its metadata and tensors (as gguf-dump)");
  cmd->add_option("file", o.file, "the .gguf file")->required();
  cmd->add_flag("--json", o.json, "print one JSON object: version, alignment, metadata, tensors");
  cmd->callback([] {
    const io::GgufFile f(o.file);
    if (o.json) {
      nlohmann::json out = {{"version", f.version()}, {"alignment", f.alignment()}, {"data_offset", f.data_offset()}};
      out["metadata"] = nlohmann::json::array();
      for (const io::GgufKv& kv : f.metadata()) {
        nlohmann::json e = {{"key", kv.key}, {"type", io::gguf_type_name(kv.type)}, {"value", kv.value}};
        if (kv.value.is_array()) e["element_type"] = io::gguf_type_name(kv.element_type);
        out["metadata"].push_back(e);
      }
      out["tensors"] = nlohmann::json::array();
      for (const io::GgufTensor& t : f.tensors())
        out["tensors"].push_back({{"name", t.name}, {"type", io::ggml_type(t.type)->name}, {"type_id", t.type}, {"ne", t.ne},
                                  {"offset", t.offset}, {"bytes", t.bytes}});
      std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      return;
    }
    uint64_t bytes = 0;
    for (const io::GgufTensor& t : f.tensors()) bytes += t.bytes;
    std::printf("%s: GGUF v%u, %zu metadata entries, %zu tensors (%s), alignment %llu\n", o.file.c_str(), f.version(),
                f.metadata().size(), f.tensors().size(), format_bytes(double(bytes)).c_str(),
                (unsigned long long)f.alignment());
    for (const io::GgufKv& kv : f.metadata())
      std::printf("  %-40s %-7s %s\n", kv.key.c_str(), io::gguf_type_name(kv.type), short_value(kv).c_str());
    for (const io::GgufTensor& t : f.tensors()) {
      std::string dims;
      for (size_t i = 0; i < t.ne.size(); ++i) dims += (i ? " x " : "") + std::to_string(t.ne[i]);
      std::printf("  %-40s %-8s %-24s %s\n", t.name.c_str(), io::ggml_type(t.type)->name, dims.c_str(),
                  format_bytes(double(t.bytes)).c_str());
    }
  });
}

}  // namespace lineage::app
