// A POST /trace/data body through serve::parse_trace_request (lineage trace's page in lineage serve),
// against a fixed model of three layers (softmax attention with 4 heads, a delta rule with 2 value
// heads, MLA with 3), a vocabulary of 100 and at most 64 tokens; then the heads it holds in full
// through serve::trace_detail_heads. The same bytes also go to serve::parse_trace_heads as a --heads
// value. Refusals must be an ApiError 400 (an Error for --heads) with a message; what is accepted must
// name existing layers and heads, once each, and ids in range.
#include <algorithm>
#include <set>
#include <string>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/serve/openai.h"
#include "lineage/serve/trace_page.h"

using namespace lineage;

namespace {

std::vector<runtime::TraceLayer> model_layers() {
  std::vector<runtime::TraceLayer> layers(3);
  layers[0].mixer = runtime::TraceMixer::Softmax, layers[0].heads = 4, layers[0].dk = layers[0].dv = 8;
  layers[1].mixer = runtime::TraceMixer::DeltaRule, layers[1].heads = 2, layers[1].qk_heads = 1;
  layers[1].dk = 16, layers[1].dv = 16, layers[1].gate = 2;
  layers[2].mixer = runtime::TraceMixer::Mla, layers[2].heads = 3;
  return layers;
}

void check_heads(const std::vector<serve::LayerHead>& heads, const std::vector<runtime::TraceLayer>& layers) {
  std::set<serve::LayerHead> seen;
  for (const auto& [l, h] : heads) {
    if (l < 0 || l >= int64_t(layers.size()) || h < 0 || h >= layers[size_t(l)].heads)
      fuzz::violated(cat("accepted head ", l, ":", h));
    if (!seen.insert({l, h}).second) fuzz::violated(cat("head ", l, ":", h, " listed twice"));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<runtime::TraceLayer> layers = model_layers();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    check_heads(serve::parse_trace_heads(std::string(body), layers, "--heads"), layers);
  } catch (const Error& e) {
    if (std::string(e.what()).find("--heads") == std::string::npos) fuzz::violated(cat("an error not naming --heads: ", e.what()));
  }
  serve::TraceRequest r;
  try {
    r = serve::parse_trace_request(body, layers, 100, 64);
  } catch (const serve::ApiError& e) {
    if (e.status != 400 || e.message.empty()) fuzz::violated(cat("refused with status ", e.status, ": ", e.message));
    return 0;
  }
  if (r.tokens.empty() == r.prompt.empty()) fuzz::violated("accepted neither or both of tokens and prompt");
  if (r.tokens.size() > 64) fuzz::violated(cat("accepted ", r.tokens.size(), " tokens"));
  for (int32_t t : r.tokens)
    if (t < 0 || t >= 100) fuzz::violated(cat("accepted token ", t));
  if (r.detail_bytes > (size_t(64) << 20)) fuzz::violated(cat("accepted detail_bytes ", r.detail_bytes));
  check_heads(r.heads, layers);
  const int64_t T = std::max<int64_t>(1, int64_t(r.tokens.size()));
  const std::vector<serve::LayerHead> detail = serve::trace_detail_heads(layers, T, r.detail_bytes, r.heads);
  check_heads(detail, layers);
  if (detail.empty()) fuzz::violated("no head in full");
  if (r.heads.empty()) {
    size_t bytes = 0;
    for (const auto& [l, h] : detail) bytes += serve::trace_head_bytes(layers[size_t(l)], T);
    if (detail.size() > 1 && bytes > r.detail_bytes) fuzz::violated(cat(bytes, " bytes of detail past the budget"));
  } else if (detail != r.heads) {
    fuzz::violated("the heads asked for are not the ones held");
  }
  return 0;
}
