// lineage trace: one self-contained HTML page that plays back what each layer stores, overwrites and
// reads back, token by token (runtime/trace_record.h records it, serve/trace_page.h draws it).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/runtime/trace_record.h"
#include "lineage/serve/trace_page.h"

namespace lineage::app {

void add_trace(CLI::App& app) {
  struct Opts {
    ModelSource src;
    std::string tokens, prompt, out = "trace.html", heads, json, detail_bytes = "16M", compare;
  };
  static Opts o;
  auto* cmd = app.add_subcommand(
      "trace", "write one HTML page that plays back each layer's memory being written, erased and read, token by token");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  add_token_options(*cmd, o.tokens, o.prompt);
  cmd->add_option("--out", o.out, "the page to write (default trace.html)");
  cmd->add_option("--heads", o.heads,
                  "LAYER:HEAD,... the heads the page holds in full (states or attention weights for every token); "
                  "default: head 0 of every layer, then head 1, ... while they fit in --detail-bytes");
  cmd->add_option("--detail-bytes", o.detail_bytes,
                  "how many bytes of per-head detail the page may hold when --heads is not given (K, M, G; default 16M)");
  cmd->add_option("--json", o.json, "also write the page's data as JSON to this file");
  cmd->add_option("--compare", o.compare,
                  "a second model (directory or GGUF file) run on the same token ids, shown side by side "
                  "(--heads applies to the first; each gets half of --detail-bytes)");
  cmd->callback([] {
    if (o.tokens.empty() && o.prompt.empty()) throw Error("trace: one of --tokens or --prompt is required");
    const size_t budget = parse_bytes(o.detail_bytes, "--detail-bytes");
    io::LoadedModel m = load(o.src, !o.prompt.empty(), false);
    const std::vector<int32_t> ids = input_ids(m, o.tokens, o.prompt, true, "trace");
    const std::string name = !o.src.preset.empty() ? o.src.preset : std::filesystem::path(o.src.dir).filename().string();
    const double t0 = steady_seconds();
    size_t heads_in_full = 0;
    double residual = 0;
    // One model's recording as the page's data, with the heads it holds in full.
    const auto record = [&](const io::LoadedModel& lm, const std::string& label, const std::string& heads, size_t bytes) {
      const std::vector<runtime::TraceLayer> layers = runtime::trace_layers(lm.model);
      const std::vector<serve::LayerHead> wanted = heads.empty() ? std::vector<serve::LayerHead>{}
                                                                 : serve::parse_trace_heads(heads, layers, "--heads");
      const std::vector<serve::LayerHead> detail = serve::trace_detail_heads(layers, int64_t(ids.size()), bytes, wanted);
      heads_in_full += detail.size();
      return serve::record_trace_payload(lm.model, lm.tokenizer ? &*lm.tokenizer : nullptr, ids, detail, label, &residual);
    };
    nlohmann::json payload = record(m, name, o.heads, o.compare.empty() ? budget : budget / 2);
    if (!o.compare.empty()) {
      ModelSource other = o.src;
      other.dir = o.compare, other.preset.clear();
      const io::LoadedModel m2 = load(other, false, false);
      try {
        payload["compare"] = record(m2, std::filesystem::path(o.compare).filename().string(), "", budget / 2);
      } catch (const Error& e) {
        throw Error(cat("--compare ", o.compare, ": ", e.what()));
      }
    }
    const double recorded = steady_seconds() - t0;
    const std::string page = serve::trace_html(payload);
    std::ofstream out(o.out, std::ios::binary);
    if (!out || !out.write(page.data(), std::streamsize(page.size())) || !out.flush())
      throw Error(cat("trace: cannot write ", o.out));
    if (!o.json.empty()) {
      std::ofstream js(o.json, std::ios::binary);
      if (!(js << payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)) || !js.flush())
        throw Error(cat("trace: cannot write ", o.json));
    }
    std::printf("%s: %zu tokens, %zu models, %zu heads in full, %s (recorded in %.2f s; the delta-rule parts sum "
                "to the engine's state to %.1e)\n",
                o.out.c_str(), ids.size(), o.compare.empty() ? size_t(1) : size_t(2), heads_in_full,
                format_bytes(double(page.size())).c_str(), recorded, residual);
  });
}

}  // namespace lineage::app
