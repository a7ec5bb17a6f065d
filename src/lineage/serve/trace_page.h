// lineage trace's page: a recording (runtime/trace_record.h) as one self-contained HTML file (the
// page trace.html, embedded at build time, with the data inside), and the same page served at
// /trace, where it fetches its data from /trace/data. docs/trace.md says what the page holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lineage/runtime/trace_record.h"
#include "lineage/tokenizer/tokenizer.h"

namespace lineage::serve {

using LayerHead = std::pair<int64_t, int64_t>;

// "3:0,3:1" → {(3, 0), (3, 1)}; each layer and head must exist in `layers` and hold per-head detail
// (a softmax, MLA or delta-rule head); anything else is an Error naming the flag and the entry.
std::vector<LayerHead> parse_trace_heads(const std::string& text, const std::vector<runtime::TraceLayer>& layers,
                                         const std::string& flag);

// The heads a page holds in full for T tokens: `wanted` when given; otherwise head 0 of every layer,
// then head 1 of every layer, ..., while their bytes stay within `budget` (the first always).
std::vector<LayerHead> trace_detail_heads(const std::vector<runtime::TraceLayer>& layers, int64_t T, size_t budget,
                                          const std::vector<LayerHead>& wanted = {});
// What one head's detail costs in the page for T tokens (before base64).
size_t trace_head_bytes(const runtime::TraceLayer& l, int64_t T);
// About what recording T tokens with `detail` heads in full holds in memory: every softmax head's
// weights, every delta-rule head's vectors and scalars, the detail heads' f32 maps (the server
// refuses a trace past its limit).
size_t trace_record_bytes(const std::vector<runtime::TraceLayer>& layers, int64_t T, const std::vector<LayerHead>& detail);

// The page's data: the recording's layers and tokens (with their text when tok is given), every
// head's per-token scalars, and the `detail` heads in full (softmax weights as 16-bit fixed point,
// delta-rule states as 8-bit with a scale per token, their vectors as f32).
nlohmann::json trace_payload(const runtime::TraceRecording& r, const tokenizer::Tokenizer* tok,
                             const std::vector<LayerHead>& detail, const std::string& model_name);

// A POST /trace/data body: {"prompt": TEXT} or {"tokens": [ids]}, optional "heads": "L:H,..." and
// "detail_bytes" (0 .. 64 MiB, default 4 MiB). Anything else wrong is an ApiError 400 naming the
// field; ids must lie in [0, vocab) and number at most max_tokens (the prompt's count is checked
// once it is encoded: check_trace_length).
struct TraceRequest {
  std::string prompt;           // when no tokens were given
  std::vector<int32_t> tokens;  // when given
  std::vector<LayerHead> heads;
  size_t detail_bytes = size_t(4) << 20;
};
TraceRequest parse_trace_request(std::string_view body, const std::vector<runtime::TraceLayer>& layers, int64_t vocab,
                                 int64_t max_tokens);
// An ApiError 400 unless 1 <= n <= max_tokens.
void check_trace_length(size_t n, int64_t max_tokens);

// Records `tokens` through m keeping the `detail` heads in full, and returns the page's data (the
// recording's worst delta-rule residual in *residual when given): lineage trace and /trace/data.
nlohmann::json record_trace_payload(const model::Model& m, const tokenizer::Tokenizer* tok,
                                    std::span<const int32_t> tokens, const std::vector<LayerHead>& detail,
                                    const std::string& model_name, double* residual = nullptr);

// The self-contained page with `payload` inside.
std::string trace_html(const nlohmann::json& payload);
// The page as the server serves it at /trace: a prompt box, data fetched from /trace/data.
std::string trace_served_html();

}  // namespace lineage::serve
