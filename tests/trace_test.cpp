// lineage trace's recording (runtime/trace_record.h) on every family's reference checkpoints: the
// delta-rule parts sum to the engine's own state, each state row is the next token's "before", the
// softmax weights are a distribution that reproduces the attention's context, the recording's read-out
// is the layer's own, and the page (serve/trace_page.h) holds what it says. The page in a browser:
// tests/serve/test_trace_page.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/runtime/session.h"
#include "lineage/runtime/trace_record.h"
#include "lineage/serve/trace_page.h"
#include "test_support.h"

namespace lineage {
namespace trace_test {

namespace fs = std::filesystem;

// The first reference case of a family (its f32 one where there is one).
fs::path first_case(const std::string& family) {
  const fs::path root = test::testdata() / family;
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "config.json")) all.push_back(e.path());
  std::sort(all.begin(), all.end());
  for (const auto& p : all)
    if (p.filename().string().rfind("f32", 0) == 0) return p;
  if (all.empty()) throw Error(cat("no reference case under ", root));
  return all.front();
}

std::vector<int32_t> tokens_for(const model::Model& m, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t((i * 7919 + 13) % m.config.vocab_size));
  return ids;
}

class TraceFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(TraceFamilies, RecordsWhatTheEngineComputes) {
  const fs::path dir = first_case(GetParam());
  SCOPED_TRACE(dir.string());
  const io::LoadedModel lm = io::load_model(dir, false);
  const model::Model& m = lm.model;
  const int T = 12;
  const std::vector<int32_t> ids = tokens_for(m, T);

  // The engine's own intermediates from a plain token-by-token decode, for comparison.
  std::map<std::string, std::vector<std::vector<float>>> seen;
  runtime::Session s(m);
  s.set_trace(layers::Trace{[&](const std::string& name, const float* d, const Shape& shape) {
    seen[name].emplace_back(d, d + shape_numel(shape));
  }, ""});
  std::vector<float> last;
  for (int32_t t : ids) {
    const auto l = s.decode(t);
    last.assign(l.begin(), l.end());
  }

  runtime::TraceOptions keep;
  keep.keep_state = [](int64_t, int64_t h) { return h < 2; };
  const runtime::TraceRecording r = runtime::record_trace(m, ids, keep);
  ASSERT_EQ(r.layers.size(), m.blocks.size());
  ASSERT_EQ(r.state_bytes.size(), size_t(T));
  int delta_layers = 0, softmax_layers = 0;
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const runtime::TraceLayer& l = r.layers[i];
    const std::string h = cat("h", i, ".");
    if (l.mixer == runtime::TraceMixer::DeltaRule) {
      ++delta_layers;
      const int64_t HV = l.heads, K = l.dk, V = l.dv;
      EXPECT_LE(l.worst_residual, 2e-5) << "layer " << i << ": decay + erase + write against the engine's state";
      ASSERT_EQ(l.norms.size(), size_t(T * HV * 5));
      ASSERT_EQ(l.states.count(0), 1u);
      const std::vector<float>& S = l.states.at(0);
      const auto& engine_states = seen.at(h + "attn.state");
      const auto& engine_core = seen.at(h + "attn.core");
      for (int t = 0; t < T; ++t) {
        // The kept state is the engine's S_t of head 0; ‖S_{t−1}‖ of the next token is ‖S_t‖ of this one.
        for (int64_t c = 0; c < K * V; ++c) ASSERT_EQ(S[size_t(t * K * V + c)], engine_states[size_t(t)][size_t(c)]);
        if (t + 1 < T) {
          for (int64_t j = 0; j < HV; ++j)
            EXPECT_NEAR(l.norms[size_t(((t + 1) * HV + j) * 5)], l.norms[size_t((t * HV + j) * 5 + 4)],
                        1e-6 * (1 + l.norms[size_t((t * HV + j) * 5 + 4)]));
        }
        for (int64_t c = 0; c < HV * V; ++c) ASSERT_EQ(l.out[size_t(t * HV * V + c)], engine_core[size_t(t)][size_t(c)]);
      }
      EXPECT_EQ(l.states.count(2), 0u) << "only the heads asked for keep their states";
      // The kept parts add up to the change of the engine's state: S_{t−1} + decay + erase + write = S_t.
      const std::vector<float>& P = l.parts.at(0);
      ASSERT_EQ(P.size(), size_t(T * 3 * K * V));
      for (int t = 0; t < T; ++t) {
        double worst = 0, top = 1e-30;
        for (int64_t c = 0; c < K * V; ++c) {
          const double prev = t ? S[size_t((t - 1) * K * V + c)] : 0.0, now = S[size_t(t * K * V + c)];
          double sum = prev;
          for (int n = 0; n < 3; ++n) sum += P[size_t((t * 3 + n) * K * V + c)];
          worst = std::max(worst, std::abs(sum - now));
          top = std::max(top, std::abs(now));
        }
        EXPECT_LE(worst / top, 2e-5) << "layer " << i << " token " << t;
      }
      if (!l.erase) {
        for (int t = 0; t < T; ++t) EXPECT_EQ(l.norms[size_t(t * HV * 5 + 2)], 0.0f) << "an additive rule erases nothing";
      }
    } else {
      ++softmax_layers;
      // Each row a distribution over keys 0 .. t.
      for (int t = 0; t < T; ++t)
        for (int64_t hh = 0; hh < l.heads; ++hh) {
          double sum = 0;
          for (int j = 0; j <= t; ++j) {
            const float w = l.weights[size_t(l.heads * t * (t + 1) / 2 + hh * (t + 1) + j)];
            ASSERT_GE(w, 0.0f);
            sum += w;
          }
          ASSERT_NEAR(sum, 1.0, 1e-5) << "layer " << i << " token " << t << " head " << hh;
        }
      if (seen.count(h + "attn.qkv")) {  // GPT-2: the weights times the cached values are the context
        const int64_t D = m.config.d_model, H = l.heads, hd = D / H;
        for (int t = 0; t < T; ++t) {
          const auto& ctx = seen.at(h + "attn.context")[size_t(t)];
          for (int64_t hh = 0; hh < H; ++hh)
            for (int64_t c = 0; c < hd; ++c) {
              double want = 0;
              for (int j = 0; j <= t; ++j)
                want += double(l.weights[size_t(H * t * (t + 1) / 2 + hh * (t + 1) + j)]) *
                        seen.at(h + "attn.qkv")[size_t(j)][size_t(2 * D + hh * hd + c)];
              ASSERT_NEAR(ctx[size_t(hh * hd + c)], want, 1e-5 * (1 + std::abs(want))) << "layer " << i;
            }
        }
      }
    }
    if (l.experts) {
      ASSERT_EQ(l.expert_ids.size(), size_t(T * l.top_k));
      for (int32_t e : l.expert_ids) ASSERT_TRUE(e >= 0 && e < l.experts);
    }
  }
  EXPECT_GT(delta_layers + softmax_layers, 0);
  // The next-token prediction is the last logits' top token.
  const auto top = std::max_element(last.begin(), last.end());
  EXPECT_EQ(r.next_id.back(), int32_t(top - last.begin()));
  // The memory grows as the model's caches do; a softmax cache as deep and wide grows by 2·L·D·4 bytes.
  EXPECT_EQ(r.softmax_bytes[1] - r.softmax_bytes[0], 2 * size_t(m.n_layers() * m.config.d_model) * 4);
  EXPECT_EQ(r.state_bytes.back(), s.state().bytes()) << "the recording's bytes against the session's own";

  // The server's estimate of a recording's memory covers what the recorder holds (and not much more).
  size_t held = 0;
  for (const runtime::TraceLayer& l : r.layers) {
    held += (l.q.size() + l.k.size() + l.v.size() + l.out.size() + l.recalled.size() + l.beta.size() +
             l.log_decay.size() + l.norms.size() + l.weights.size()) * sizeof(float);
    for (const auto& [head, s] : l.states) held += (s.size() + l.parts.at(head).size()) * sizeof(float);
  }
  std::vector<serve::LayerHead> kept;
  for (size_t i = 0; i < r.layers.size(); ++i)
    for (const auto& [head, s] : r.layers[i].states) kept.emplace_back(int64_t(i), head);
  const size_t estimate = serve::trace_record_bytes(r.layers, T, kept);
  EXPECT_GE(estimate, held);
  EXPECT_LE(estimate, 2 * held + 4096);

  // The page's data: the detail heads it was given, every delta head's scalars, decodable sizes.
  const std::vector<serve::LayerHead> detail = serve::trace_detail_heads(r.layers, T, 1, {});
  ASSERT_EQ(detail.size(), 1u) << "a budget below one head still holds the first";
  runtime::TraceOptions first;
  first.keep_state = [&](int64_t l, int64_t h) { return serve::LayerHead{l, h} == detail[0]; };
  const nlohmann::json j = serve::trace_payload(runtime::record_trace(m, ids, first), nullptr, detail, "case");
  EXPECT_EQ(j["tokens"].size(), size_t(T));
  EXPECT_EQ(j["layers"][size_t(detail[0].first)]["detail"], nlohmann::json::array({detail[0].second}));
  const std::string html = serve::trace_html(j);
  EXPECT_NE(html.find("\"format\":\"lineage-trace-1\""), std::string::npos);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Families, TraceFamilies,
                         ::testing::Values("gpt2", "linear_attn", "delta_net", "gated_deltanet", "kda", "kimi_linear",
                                           "kimi_k3", "qwen3_next", "qwen3_5_moe"));

TEST(Trace, HeadsAreCheckedByName) {
  const io::LoadedModel lm = io::load_model(first_case("kimi_linear"), false);
  const auto layers = runtime::trace_layers(lm.model);
  EXPECT_EQ(serve::parse_trace_heads("0:1,0:1,1:0", layers, "--heads"),
            (std::vector<serve::LayerHead>{{0, 1}, {1, 0}}));
  const auto refused = [&](const std::string& text, const std::string& piece) {
    try {
      serve::parse_trace_heads(text, layers, "--heads");
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--heads"), std::string::npos) << e.what();
    }
  };
  refused("99:0", "layer 99");
  refused("0:999", "head 999");
  refused("0", "LAYER:HEAD");
  refused("a:b", "LAYER:HEAD");
  refused("0:-1", "LAYER:HEAD");
  refused("", "LAYER:HEAD");
  EXPECT_THROW(runtime::record_trace(lm.model, std::vector<int32_t>{}), Error);
  EXPECT_THROW(runtime::record_trace(lm.model, std::vector<int32_t>{int32_t(lm.model.config.vocab_size)}), Error);
}

}  // namespace trace_test
}  // namespace lineage
