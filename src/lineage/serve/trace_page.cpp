#include "lineage/serve/trace_page.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "lineage/core/error.h"
#include "lineage/serve/openai.h"
#include "lineage/serve/trace_html.h"  // kTracePage, generated from trace.html

namespace lineage::serve {

using runtime::TraceLayer;
using runtime::TraceMixer;

namespace {

constexpr const char* kDataMarker = "<script id=\"trace-data\" type=\"application/json\">null</script>";
constexpr const char* kServedMarker = "const SERVED = false;";

std::string base64(const void* data, size_t n) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t a = p[i], b = i + 1 < n ? p[i + 1] : 0, c = i + 2 < n ? p[i + 2] : 0;
    const uint32_t w = (a << 16) | (b << 8) | c;
    out += abc[(w >> 18) & 63];
    out += abc[(w >> 12) & 63];
    out += i + 1 < n ? abc[(w >> 6) & 63] : '=';
    out += i + 2 < n ? abc[w & 63] : '=';
  }
  return out;
}

// A typed array for the page: {"dtype", "shape", "b64"} (little-endian, as the page's typed arrays read it).
template <class T>
nlohmann::json array(const char* dtype, std::span<const T> v, std::vector<int64_t> shape) {
  return {{"dtype", dtype}, {"shape", shape}, {"b64", base64(v.data(), v.size_bytes())}};
}

nlohmann::json f32(std::span<const float> v, std::vector<int64_t> shape) { return array("f32", v, std::move(shape)); }

// Rows [T, width] of head h out of rows [T, heads, width].
std::vector<float> head_rows(const std::vector<float>& all, int64_t T, int64_t heads, int64_t h, int64_t width) {
  std::vector<float> out(size_t(T * width));
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(out.data() + t * width, all.data() + (t * heads + h) * width, size_t(width) * sizeof(float));
  return out;
}

// Maps [T, n, size] as int8 codes with one scale per (t, map): the codes and the scales [T, n].
std::pair<std::vector<int8_t>, std::vector<float>> int8_maps(const std::vector<float>& x, int64_t T, int64_t n,
                                                             int64_t size) {
  std::vector<int8_t> codes(x.size());
  std::vector<float> scale(static_cast<size_t>(T * n));
  for (int64_t m = 0; m < T * n; ++m) {
    const float* s = x.data() + m * size;
    float top = 0;
    for (int64_t c = 0; c < size; ++c) top = std::max(top, std::abs(s[c]));
    scale[size_t(m)] = top > 0 ? top / 127.0f : 1.0f;
    for (int64_t c = 0; c < size; ++c) codes[size_t(m * size + c)] = int8_t(std::lround(s[c] / scale[size_t(m)]));
  }
  return {std::move(codes), std::move(scale)};
}

const char* mixer_name(TraceMixer m) {
  return m == TraceMixer::DeltaRule ? "delta" : m == TraceMixer::Mla ? "mla" : "softmax";
}

bool has_heads(const TraceLayer& l) { return l.heads > 0; }

}  // namespace

size_t trace_head_bytes(const TraceLayer& l, int64_t T) {
  if (l.mixer != TraceMixer::DeltaRule) return size_t(T * (T + 1) / 2) * sizeof(uint16_t);
  const int64_t vectors = 2 * l.dk + 3 * l.dv + (l.gate == 2 ? l.dk : 0);
  return size_t(T) * (4 * size_t(l.dk * l.dv) + sizeof(float) * size_t(vectors + 4));
}

size_t trace_record_bytes(const std::vector<TraceLayer>& layers, int64_t T, const std::vector<LayerHead>& detail) {
  size_t floats = 0;
  for (const TraceLayer& l : layers) {
    if (l.mixer != TraceMixer::DeltaRule) {
      floats += size_t(l.heads) * size_t(T) * size_t(T + 1) / 2;
      continue;
    }
    const int64_t decay = l.gate == 2 ? l.dk : int64_t(l.gate);  // log decay floats a head: K, 1 or none
    const size_t per_token = size_t(2 * l.qk_heads * l.dk + 3 * l.heads * l.dv + l.heads * (6 + decay));
    floats += per_token * size_t(T);
  }
  for (const auto& [layer, head] : detail) {
    const TraceLayer& l = layers[size_t(layer)];
    if (l.mixer == TraceMixer::DeltaRule) floats += 4 * size_t(l.dk * l.dv) * size_t(T);
  }
  return floats * sizeof(float);
}

std::vector<LayerHead> parse_trace_heads(const std::string& text, const std::vector<TraceLayer>& layers,
                                         const std::string& flag) {
  std::vector<LayerHead> out;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t end = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, end - i);
    const size_t colon = item.find(':');
    const auto number = [&](const std::string& s) -> int64_t {
      if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        throw Error(cat(flag, ": '", item, "' is not LAYER:HEAD (two whole numbers, e.g. 3:0)"));
      return std::stoll(s);
    };
    if (colon == std::string::npos) throw Error(cat(flag, ": '", item, "' is not LAYER:HEAD (e.g. 3:0)"));
    const int64_t layer = number(item.substr(0, colon)), head = number(item.substr(colon + 1));
    if (layer >= int64_t(layers.size()))
      throw Error(cat(flag, ": layer ", layer, " in '", item, "': the model has ", layers.size(), " layers (0 .. ",
                      layers.size() - 1, ")"));
    const TraceLayer& l = layers[size_t(layer)];
    if (!has_heads(l)) throw Error(cat(flag, ": layer ", layer, " (", l.kind, ") records no heads"));
    if (head >= l.heads)
      throw Error(cat(flag, ": head ", head, " in '", item, "': layer ", layer, " (", l.kind, ") has ", l.heads,
                      " heads (0 .. ", l.heads - 1, ")"));
    if (std::find(out.begin(), out.end(), LayerHead{layer, head}) == out.end()) out.emplace_back(layer, head);
    i = end + 1;
  }
  return out;
}

std::vector<LayerHead> trace_detail_heads(const std::vector<TraceLayer>& layers, int64_t T, size_t budget,
                                          const std::vector<LayerHead>& wanted) {
  if (!wanted.empty()) return wanted;
  std::vector<LayerHead> out;
  size_t used = 0;
  int64_t most = 0;
  for (const TraceLayer& l : layers) most = std::max(most, l.heads);
  for (int64_t h = 0; h < most; ++h)
    for (size_t i = 0; i < layers.size(); ++i) {
      const TraceLayer& l = layers[i];
      if (h >= l.heads) continue;
      const size_t b = trace_head_bytes(l, T);
      if (!out.empty() && used + b > budget) return out;
      out.emplace_back(int64_t(i), h);
      used += b;
    }
  return out;
}

nlohmann::json trace_payload(const runtime::TraceRecording& r, const tokenizer::Tokenizer* tok,
                             const std::vector<LayerHead>& detail, const std::string& model_name) {
  const int64_t T = int64_t(r.tokens.size());
  nlohmann::json j;
  j["format"] = "lineage-trace-1";
  j["model"] = model_name;
  j["tokens"] = r.tokens;
  std::vector<std::string> pieces, next;
  for (int64_t t = 0; t < T; ++t) {
    // Without a tokenizer, the ids with a space after each.
    pieces.push_back(tok ? tok->decode(std::span<const int32_t>(&r.tokens[size_t(t)], 1)) : cat(r.tokens[size_t(t)], " "));
    next.push_back(tok ? tok->decode(std::span<const int32_t>(&r.next_id[size_t(t)], 1)) : std::to_string(r.next_id[size_t(t)]));
  }
  j["pieces"] = pieces;
  j["next"] = {{"ids", r.next_id}, {"pieces", next}, {"p", r.next_p}};
  j["state_bytes"] = r.state_bytes;
  j["softmax_bytes"] = r.softmax_bytes;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const TraceLayer& l = r.layers[i];
    nlohmann::json o = {{"index", i},
                        {"mixer", mixer_name(l.mixer)},
                        {"kind", l.kind},
                        {"heads", l.heads},
                        {"bytes_per_token", l.bytes_per_token},
                        {"fixed_bytes", l.fixed_bytes}};
    std::vector<int64_t> held;
    for (const auto& [layer, head] : detail)
      if (layer == int64_t(i)) held.push_back(head);
    std::sort(held.begin(), held.end());
    o["detail"] = held;
    nlohmann::json heads = nlohmann::json::object();
    if (l.mixer == TraceMixer::DeltaRule) {
      const int64_t HV = l.heads, H = l.qk_heads, K = l.dk, V = l.dv;
      o.update({{"qk_heads", H}, {"k", K}, {"v", V}, {"erase", l.erase},
                {"gate", l.gate == 0 ? "none" : l.gate == 1 ? "head" : "channel"}, {"residual", l.worst_residual}});
      // Every head, every token: β, the mean log decay over the head's channels (0 without decay),
      // and the Frobenius norms of S_{t−1}, the decay part, the erase, the write and S_t.
      std::vector<float> scalars(size_t(T * HV * 7));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < HV; ++h) {
          float* s = scalars.data() + (t * HV + h) * 7;
          s[0] = l.beta[size_t(t * HV + h)];
          double g = 0;
          if (l.gate == 1) g = l.log_decay[size_t(t * HV + h)];
          if (l.gate == 2) {
            for (int64_t a = 0; a < K; ++a) g += l.log_decay[size_t((t * HV + h) * K + a)];
            g /= double(K);
          }
          s[1] = float(g);
          std::copy_n(l.norms.data() + (t * HV + h) * 5, 5, s + 2);
        }
      o["scalars"] = f32(scalars, {T, HV, 7});
      for (int64_t h : held) {
        const int64_t hq = h / (HV / H);
        nlohmann::json d;
        d["q"] = f32(head_rows(l.q, T, H, hq, K), {T, K});
        d["k"] = f32(head_rows(l.k, T, H, hq, K), {T, K});
        d["v"] = f32(head_rows(l.v, T, HV, h, V), {T, V});
        d["out"] = f32(head_rows(l.out, T, HV, h, V), {T, V});
        d["recalled"] = f32(head_rows(l.recalled, T, HV, h, V), {T, V});
        if (l.gate == 2) d["decay"] = f32(head_rows(l.log_decay, T, HV, h, K), {T, K});
        const auto it = l.states.find(h);
        if (it == l.states.end()) throw Error(cat("trace: layer ", i, " head ", h, "'s states were not kept"));
        const auto parts = l.parts.find(h);
        if (parts == l.parts.end()) throw Error(cat("trace: layer ", i, " head ", h, "'s parts were not kept"));
        // S_t and the three parts, each map as symmetric 8-bit codes with one scale a token: x ≈ code · scale.
        const auto [codes, scale] = int8_maps(it->second, T, 1, K * V);
        d["state"] = array<int8_t>("i8", codes, {T, K, V});
        d["state_scale"] = f32(scale, {T});
        const auto [part_codes, part_scale] = int8_maps(parts->second, T, 3, K * V);
        d["parts"] = array<int8_t>("i8", part_codes, {T, 3, K, V});
        d["parts_scale"] = f32(part_scale, {T, 3});
        heads[std::to_string(h)] = d;
      }
    } else {
      for (int64_t h : held) {  // token t's weights over keys 0 .. t, packed at t(t+1)/2: 16-bit fixed point
        std::vector<uint16_t> w(size_t(T * (T + 1) / 2));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j <= t; ++j) {
            const float x = l.weights[size_t(l.heads * t * (t + 1) / 2 + h * (t + 1) + j)];
            w[size_t(t * (t + 1) / 2 + j)] = uint16_t(std::lround(std::clamp(x, 0.0f, 1.0f) * 65535.0f));
          }
        heads[std::to_string(h)] = {{"weights", array<uint16_t>("u16", w, {T * (T + 1) / 2})}};
      }
    }
    o["head_data"] = heads;
    if (l.experts) {
      o["experts"] = l.experts;
      o["top_k"] = l.top_k;
      o["expert_ids"] = array<int32_t>("i32", l.expert_ids, {T, l.top_k});
      o["expert_weights"] = f32(l.expert_weights, {T, l.top_k});
    }
    if (l.attn_res_sources) o["attn_res"] = f32(l.attn_res, {T, l.attn_res_sources});
    if (l.mlp_res_sources) o["mlp_res"] = f32(l.mlp_res, {T, l.mlp_res_sources});
    layers.push_back(std::move(o));
  }
  j["layers"] = std::move(layers);
  return j;
}

void check_trace_length(size_t n, int64_t max_tokens) {
  if (n == 0 || int64_t(n) > max_tokens)
    throw ApiError{400, cat("the prompt has ", n, " tokens; a trace takes 1 to ", max_tokens, " (--trace-max-tokens)"),
                   "invalid_request_error", "prompt", "context_length_exceeded"};
}

TraceRequest parse_trace_request(std::string_view body, const std::vector<TraceLayer>& layers, int64_t vocab,
                                 int64_t max_tokens) {
  using json = nlohmann::json;
  const auto bad = [](const std::string& field, const std::string& message) {
    return ApiError{400, field.empty() ? message : field + ": " + message, "invalid_request_error", field, "invalid_value"};
  };
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object()) throw ApiError{400, "the body is not a JSON object", "invalid_request_error", "", "invalid_json"};
  TraceRequest r;
  if (j.contains("tokens")) {
    const json& t = j["tokens"];
    if (!t.is_array() || t.empty()) throw bad("tokens", "expected a non-empty array of token ids");
    if (int64_t(t.size()) > max_tokens) check_trace_length(t.size(), max_tokens);
    for (const json& x : t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
        throw bad("tokens", cat("expected ids in [0, ", vocab, ")"));
      r.tokens.push_back(int32_t(x.get<int64_t>()));
    }
  } else {
    if (!j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
      throw bad("prompt", "expected a non-empty string (or tokens: an array of ids)");
    r.prompt = j["prompt"].get<std::string>();
  }
  if (j.contains("heads")) {
    if (!j["heads"].is_string()) throw bad("heads", "expected a string LAYER:HEAD,...");
    const std::string heads = j["heads"].get<std::string>();
    try {
      if (!heads.empty()) r.heads = parse_trace_heads(heads, layers, "heads");
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", "heads", "invalid_value"};
    }
  }
  if (j.contains("detail_bytes")) {
    const json& b = j["detail_bytes"];
    if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() > (int64_t(64) << 20))
      throw bad("detail_bytes", "expected an integer from 0 to 67108864");
    r.detail_bytes = size_t(b.get<int64_t>());
  }
  return r;
}

nlohmann::json record_trace_payload(const model::Model& m, const tokenizer::Tokenizer* tok,
                                    std::span<const int32_t> tokens, const std::vector<LayerHead>& detail,
                                    const std::string& model_name, double* residual) {
  runtime::TraceOptions options;
  options.keep_state = [&](int64_t layer, int64_t head) {
    return std::find(detail.begin(), detail.end(), LayerHead{layer, head}) != detail.end();
  };
  const runtime::TraceRecording rec = runtime::record_trace(m, tokens, options);
  if (residual)
    for (const TraceLayer& l : rec.layers) *residual = std::max(*residual, l.worst_residual);
  return trace_payload(rec, tok, detail, model_name);
}

std::string trace_html(const nlohmann::json& payload) {
  std::string page = kTracePage;
  const size_t at = page.find(kDataMarker);
  LINEAGE_CHECK(at != std::string::npos, "trace.html lost its data marker");
  std::string data = payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Inside JSON strings "<", ">" and "&" may be written \u003c, \u003e, \u0026: a token "</script>"
  // or "<!--" then cannot end or bend the script element the data sits in.
  std::string safe;
  safe.reserve(data.size());
  for (char ch : data) {
    if (ch == '<') safe += "\\u003c";
    else if (ch == '>') safe += "\\u003e";
    else if (ch == '&') safe += "\\u0026";
    else safe += ch;
  }
  const std::string open = "<script id=\"trace-data\" type=\"application/json\">";
  page.replace(at, std::strlen(kDataMarker), open + safe + "</script>");
  return page;
}

std::string trace_served_html() {
  std::string page = kTracePage;
  const size_t at = page.find(kServedMarker);
  LINEAGE_CHECK(at != std::string::npos, "trace.html lost its SERVED marker");
  page.replace(at, std::strlen(kServedMarker), "const SERVED = true;");
  return page;
}

}  // namespace lineage::serve
