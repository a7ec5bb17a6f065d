#include "lineage/runtime/state_file.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lineage/core/checked.h"
#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/json_read.h"
#include "lineage/model/accounting.h"
#include "lineage/model/state_pool.h"

namespace lineage::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'L', 'I', 'N', 'S', 'T', 'A', 'T', 'E'};
constexpr size_t kPrefix = 24;  // magic, u32 version, u32 flags, u64 header bytes
constexpr int64_t kAlign = 64;

int64_t padded(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get_u(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

const char* kind_name(const model::MixerState& s) {
  if (std::holds_alternative<layers::Attention::State>(s)) return "attention";
  if (std::holds_alternative<layers::Mla::State>(s)) return "mla";
  return "delta_rule";
}

// Calls f(run, elements) over the contiguous innermost runs of a strided array, in row-major order.
template <class F>
void for_each_run(const model::StateArray& a, F&& f) {
  if (a.elements() == 0) return;
  const size_t nd = a.shape.size();
  const int64_t inner = a.shape[nd - 1];
  std::vector<int64_t> idx(nd - 1, 0);
  while (true) {
    int64_t off = 0;
    for (size_t d = 0; d + 1 < nd; ++d) off += idx[d] * a.strides[d];
    f(a.data + off, inner);
    size_t d = nd - 1;
    while (d > 0 && ++idx[d - 1] == a.shape[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

// The state's arrays (views; the state is not modified) and the header that lays them out.
struct Layout {
  json header;
  std::vector<std::vector<model::StateArray>> arrays;
  int64_t tokens_offset = 0, logits_offset = 0, payload = 0;
};

Layout layout(const model::Model& m, const SavedState& s) {
  LINEAGE_CHECK(s.state.layers.size() == m.blocks.size(), "write_state: a state of another model");
  LINEAGE_CHECK(s.tokens.empty() || int64_t(s.tokens.size()) == s.state.position,
                "write_state: tokens must be empty or one per position");
  LINEAGE_CHECK(s.logits.empty() || int64_t(s.logits.size()) == m.config.vocab_size,
                "write_state: logits must be empty or [vocab]");
  Layout L;
  const model::Identity id = model::identity(m);
  int64_t at = 0;
  const auto place = [&](int64_t bytes) {
    const int64_t o = at;
    at += padded(bytes);
    return o;
  };
  L.tokens_offset = place(int64_t(s.tokens.size()) * 4);
  L.logits_offset = place(int64_t(s.logits.size()) * 4);
  json layers = json::array();
  // state_arrays hands out writable views; writing only reads through them.
  auto& state = const_cast<model::SequenceState&>(s.state);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    L.arrays.push_back(model::state_arrays(m, state, i));
    json arrays = json::array();
    for (const auto& a : L.arrays.back()) {
      const int64_t bytes = a.elements() * 4;
      arrays.push_back({{"name", a.name}, {"dtype", "F32"}, {"shape", a.shape}, {"offset", place(bytes)}, {"bytes", bytes}});
    }
    layers.push_back({{"kind", kind_name(s.state.layers[i])}, {"arrays", std::move(arrays)}});
  }
  L.payload = at;
  json rng = nullptr;
  if (s.rng) {
    uint32_t spare_bits;
    std::memcpy(&spare_bits, &s.rng->spare, 4);
    rng = {{"state", hex64(s.rng->state)}, {"spare_bits", spare_bits}, {"has_spare", s.rng->has_spare}};
  }
  L.header = {{"format", "lineage-state"},
              {"version", kStateFileVersion},
              {"model",
               {{"model_type", m.config.model_type},
                {"config_hash", hex64(id.config_hash)},
                {"tensors_hash", hex64(id.tensors_hash)},
                {"layers", m.n_layers()},
                {"vocab_size", m.config.vocab_size}}},
              {"position", s.state.position},
              {"tokens", {{"offset", L.tokens_offset}, {"count", s.tokens.size()}}},
              {"logits", {{"offset", L.logits_offset}, {"count", s.logits.size()}}},
              {"rng", rng},
              {"meta", s.meta},
              {"layers", std::move(layers)},
              {"payload_bytes", L.payload}};
  return L;
}

}  // namespace

void write_state(const model::Model& m, const SavedState& s, const std::function<void(const void*, size_t)>& sink) {
  const Layout L = layout(m, s);
  const std::string header = L.header.dump();
  Hasher h;
  int64_t written = 0;
  const auto out = [&](const void* p, size_t n) {
    if (n == 0) return;  // an empty section's data() may be null
    h.add(p, n);
    sink(p, n);
    written += int64_t(n);
  };
  static const char zeros[kAlign] = {};
  const auto pad = [&] { out(zeros, size_t(padded(written) - written)); };
  unsigned char prefix[kPrefix];
  std::memcpy(prefix, kMagic, 8);
  put_u32(prefix + 8, kStateFileVersion);
  put_u32(prefix + 12, 0);
  put_u64(prefix + 16, header.size());
  out(prefix, kPrefix);
  out(header.data(), header.size());
  pad();
  const int64_t base = written;
  const auto section = [&](int64_t offset) {
    LINEAGE_CHECK(written - base == offset, "state file layout out of step");
  };
  section(L.tokens_offset);
  out(s.tokens.data(), s.tokens.size() * 4);
  pad();
  section(L.logits_offset);
  out(s.logits.data(), s.logits.size() * 4);
  pad();
  for (const auto& layer : L.arrays)
    for (const auto& a : layer) {
      for_each_run(a, [&](const float* run, int64_t n) { out(run, size_t(n) * 4); });
      pad();
    }
  section(L.payload);
  unsigned char sum[8];
  put_u64(sum, h.value());
  sink(sum, 8);
}

std::string encode_state(const model::Model& m, const SavedState& s) {
  std::string bytes;
  write_state(m, s, [&](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); });
  return bytes;
}

namespace {

// A header field, checked: `what` says what was expected.
const json& field(const json& j, const char* key, bool (json::*is)() const noexcept, const char* what,
                  const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !(j[key].*is)())
    throw Error(cat(where, ": header field \"", key, "\": expected ", what,
                    j.is_object() && j.contains(key) ? cat(", found ", j[key].dump()) : std::string(", it is missing")));
  return j[key];
}

int64_t count_field(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, &json::is_number_unsigned, "an integer >= 0", where);
  if (v.get<uint64_t>() > uint64_t(1) << 50) throw Error(cat(where, ": header field \"", key, "\": ", v.dump(), " is too large"));
  return v.get<int64_t>();
}

// A section [offset, offset + bytes) of the payload, bounds-checked.
const char* section(std::string_view payload, int64_t offset, int64_t bytes, const std::string& what,
                    const std::string& where) {
  const auto end = checked_add(offset, bytes);
  if (!end || *end > int64_t(payload.size()))
    throw Error(cat(where, ": ", what, " lies outside the file (offset ", offset, ", ", bytes, " bytes; the payload holds ",
                    payload.size(), ")"));
  return payload.data() + offset;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += cat(i ? ", " : "", s[i]);
  return out + "]";
}

}  // namespace

SavedState decode_state(const model::Model& m, std::string_view bytes, const std::string& where) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw Error(cat(where, ": not a lineage state file (it does not begin with \"LINSTATE\")"));
  if (bytes.size() < kPrefix + 8)
    throw Error(cat(where, ": truncated: ", bytes.size(), " bytes, shorter than a state file's fixed header"));
  const uint32_t version = uint32_t(get_u(bytes.data() + 8, 4));
  if (version != kStateFileVersion)
    throw Error(cat(where, ": state file version ", version, "; this lineage reads version ", kStateFileVersion));
  const uint64_t header_bytes = get_u(bytes.data() + 16, 8);
  if (header_bytes > bytes.size() - kPrefix - 8)
    throw Error(cat(where, ": truncated: the header claims ", header_bytes, " bytes, the file holds ", bytes.size()));
  const json header = parse_json(bytes.substr(kPrefix, header_bytes), cat(where, ": header"));
  if (!header.is_object()) throw Error(cat(where, ": header: expected a JSON object"));
  const int64_t base = padded(int64_t(kPrefix + header_bytes));
  const int64_t payload_bytes = count_field(header, "payload_bytes", where);
  const auto expected = checked_add(base, payload_bytes);
  if (!expected || *expected + 8 != int64_t(bytes.size()))
    throw Error(cat(where, ": ", expected && *expected + 8 > int64_t(bytes.size()) ? "truncated: " : "",
                    "expected ", expected ? cat(*expected + 8) : std::string("an impossible size of"),
                    " bytes (header and payload and checksum), the file holds ", bytes.size()));
  const uint64_t stored = get_u(bytes.data() + bytes.size() - 8, 8);
  const uint64_t computed = Hasher().add(bytes.data(), bytes.size() - 8).value();
  if (stored != computed)
    throw Error(cat(where, ": checksum mismatch (stored ", hex64(stored), ", computed ", hex64(computed),
                    "): the file is corrupted"));

  // The model it belongs to.
  const json& mj = field(header, "model", &json::is_object, "an object", where);
  const model::Identity id = model::identity(m);
  const std::string type = field(mj, "model_type", &json::is_string, "a string", where).get<std::string>();
  const std::string cfg = field(mj, "config_hash", &json::is_string, "16 hex digits", where).get<std::string>();
  const std::string tensors = field(mj, "tensors_hash", &json::is_string, "16 hex digits", where).get<std::string>();
  if (type != m.config.model_type || cfg != hex64(id.config_hash) || tensors != hex64(id.tensors_hash))
    throw Error(cat(where, ": a state of another model: saved from a ", type, " with config ", cfg, " and tensors ",
                    tensors, "; this model is a ", m.config.model_type, " with ", id.str(),
                    type != m.config.model_type         ? " (another architecture)"
                    : tensors != hex64(id.tensors_hash) ? " (other tensor names or shapes)"
                                                        : " (another config.json)"));

  SavedState out;
  const std::string_view payload = bytes.substr(size_t(base), size_t(payload_bytes));
  const int64_t position = count_field(header, "position", where);
  if (m.config.max_positions > 0 && position > m.config.max_positions)
    throw Error(cat(where, ": header field \"position\": ", position, " exceeds the model's context of ",
                    m.config.max_positions));
  const auto vector_section = [&](const char* key, auto& dst, int64_t allowed_a, int64_t allowed_b) {
    const json& j = field(header, key, &json::is_object, "an object with offset and count", where);
    const int64_t n = count_field(j, "count", where), offset = count_field(j, "offset", where);
    if (n != allowed_a && n != allowed_b)
      throw Error(cat(where, ": header field \"", key, "\": count ", n, ", expected ", allowed_a, " or ", allowed_b));
    const char* p = section(payload, offset, n * 4, key, where);
    dst.resize(size_t(n));
    if (n > 0) std::memcpy(dst.data(), p, size_t(n) * 4);
  };
  vector_section("tokens", out.tokens, 0, position);
  vector_section("logits", out.logits, 0, m.config.vocab_size);
  for (size_t i = 0; i < out.tokens.size(); ++i)
    if (out.tokens[i] < 0 || out.tokens[i] >= m.config.vocab_size)
      throw Error(cat(where, ": token ", i, " is id ", out.tokens[i], ", outside the vocabulary of ", m.config.vocab_size));
  if (header.contains("rng") && !header["rng"].is_null()) {
    const json& r = field(header, "rng", &json::is_object, "an object or null", where);
    const std::string st = field(r, "state", &json::is_string, "16 hex digits", where).get<std::string>();
    if (st.size() != 16 || st.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw Error(cat(where, ": header field \"rng.state\": expected 16 hex digits, found \"", st, "\""));
    const json& bits = field(r, "spare_bits", &json::is_number_unsigned, "an unsigned 32-bit integer", where);
    if (bits.get<uint64_t>() > 0xffffffffu) throw Error(cat(where, ": header field \"rng.spare_bits\": out of range"));
    Rng::Snapshot snap;
    snap.state = std::stoull(st, nullptr, 16);
    const uint32_t b = bits.get<uint32_t>();
    std::memcpy(&snap.spare, &b, 4);
    snap.has_spare = field(r, "has_spare", &json::is_boolean, "true or false", where).get<bool>();
    out.rng = snap;
  }

  if (header.contains("meta")) out.meta = header["meta"];

  // Every layer, against the layout this model gives a state of that position. Each array's bytes
  // are checked to lie within the file before the state is sized, so a crafted position cannot
  // make it allocate more than the file holds.
  const json& lj = field(header, "layers", &json::is_array, "an array of layers", where);
  if (int64_t(lj.size()) != m.n_layers())
    throw Error(cat(where, ": ", lj.size(), " layers; this model has ", m.n_layers()));
  for (size_t i = 0; i < lj.size(); ++i) {
    const json& arrays = field(lj[i], "arrays", &json::is_array, "an array", cat(where, ": layer ", i));
    for (const auto& a : arrays) {
      const std::string w = cat(where, ": layer ", i);
      section(payload, count_field(a, "offset", w), count_field(a, "bytes", w), cat("layer ", i, "'s array"), where);
    }
  }
  out.state = m.new_state();
  model::set_length(m, out.state, position);
  for (size_t i = 0; i < lj.size(); ++i) {
    const std::string w = cat(where, ": layer ", i);
    const std::string kind = field(lj[i], "kind", &json::is_string, "a string", w).get<std::string>();
    if (kind != kind_name(out.state.layers[i]))
      throw Error(cat(w, ": a ", kind, " layer's state; this model's layer ", i, " is ", kind_name(out.state.layers[i])));
    const json& arrays = lj[i]["arrays"];
    std::vector<model::StateArray> views = model::state_arrays(m, out.state, i);
    if (arrays.size() != views.size())
      throw Error(cat(w, ": ", arrays.size(), " arrays; this model's layer holds ", views.size()));
    for (size_t k = 0; k < views.size(); ++k) {
      const json& a = arrays[k];
      const std::string name = field(a, "name", &json::is_string, "a string", w).get<std::string>();
      const std::string dtype = field(a, "dtype", &json::is_string, "a string", w).get<std::string>();
      const json& sj = field(a, "shape", &json::is_array, "an array of dimensions", w);
      std::vector<int64_t> shape;
      for (const auto& d : sj) {
        if (!d.is_number_unsigned()) throw Error(cat(w, ": array \"", name, "\": shape ", sj.dump(), " is not dimensions"));
        shape.push_back(d.get<int64_t>());
      }
      const model::StateArray& v = views[k];
      if (name != v.name || dtype != "F32" || shape != v.shape)
        throw Error(cat(w, ": array \"", name, "\" ", dtype, " ", shape_str(shape), "; expected \"", v.name, "\" F32 ",
                        shape_str(v.shape), " (position ", position, ")"));
      const int64_t n = count_field(a, "bytes", w);
      if (n != v.elements() * 4)
        throw Error(cat(w, ": array \"", name, "\": ", n, " bytes, expected ", v.elements() * 4));
      const char* src = section(payload, count_field(a, "offset", w), n, cat("array \"", name, "\""), w);
      for_each_run(v, [&](float* run, int64_t len) {
        std::memcpy(run, src, size_t(len) * 4);
        src += len * 4;
      });
    }
  }
  return out;
}

void save_state(const fs::path& path, const model::Model& m, const SavedState& s) {
  const fs::path tmp = fs::path(path.string() + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(cat(path.string(), ": cannot be written (", std::strerror(errno), ")"));
    write_state(m, s, [&](const void* p, size_t n) { f.write(static_cast<const char*>(p), std::streamsize(n)); });
    f.flush();
    if (!f) throw Error(cat(path.string(), ": writing failed (", std::strerror(errno), ")"));
  }
  fs::rename(tmp, path);
}

SavedState load_state(const fs::path& path, const model::Model& m) {
  if (!fs::is_regular_file(path)) throw Error(cat(path.string(), ": state file does not exist"));
  return decode_state(m, read_file_text(path), path.string());
}

}  // namespace lineage::runtime
