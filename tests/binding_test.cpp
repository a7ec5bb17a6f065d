// The binding table: a family's file says where a checkpoint keeps each parameter (renamed, split,
// fused, squeezed, optional, ignored, packed), and a checkpoint rewritten that way binds to the
// same model, giving the same logits as the original.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/io/load_model.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/forward.h"
#include "lineage/runtime/session.h"
#include "test_support.h"

namespace lineage {
namespace binding_test {
namespace {

namespace fs = std::filesystem;
using Tensors = std::map<std::string, Tensor>;

fs::path kda_dir() { return test::testdata() / "kda" / "f32"; }

// The reference KDA checkpoint's tensors, owned, to rewrite.
Tensors kda_tensors() {
  const io::Checkpoint ckpt = io::Checkpoint::open(kda_dir());
  Tensors t;
  for (const auto& n : ckpt.names()) t[n] = ckpt.tensor(n).clone();
  return t;
}

// The KDA skeleton of the reference config with `rules` added to its table, bound to `tensors`
// written as a checkpoint.
model::Model bind_rewritten(const Tensors& tensors, const std::function<void(model::Model&)>& rules) {
  const fs::path dir = test::temp_dir();
  fs::copy_file(kda_dir() / "config.json", dir / "config.json");
  io::save_safetensors(dir / "model.safetensors", {tensors.begin(), tensors.end()});
  const nlohmann::json cfg = read_json_file(dir / "config.json");
  model::Model m = model::build_kda({model::ConfigFields(cfg, "config.json"), [&](const std::string& n) {
                                       return tensors.count(n) > 0;
                                     }});
  if (rules) rules(m);
  io::bind_weights(m, io::Checkpoint::open(dir), dir.string());
  model::prepare(m, true);  // owned copies: the checkpoint's mapping goes with this scope
  return m;
}

std::vector<float> logits(const model::Model& m) {
  runtime::Session s(m);
  const std::vector<int32_t> ids = {3, 17, 5, 99, 42, 7, 1, 250};
  const auto l = s.prefill(ids, true);
  return {l.begin(), l.end()};
}

std::vector<float> reference_logits() {
  const io::LoadedModel lm = io::load_model(kda_dir(), false);
  return logits(lm.model);
}

std::string layer(int i) { return "model.layers." + std::to_string(i) + "."; }

// The same weights bound another way: the same logits up to the GEMV's summation order, which
// depends on where in a cache line each weight row starts (a view of rows, a new file's offsets).
void expect_same_logits(const model::Model& m) {
  const std::vector<float> got = logits(m), want = reference_logits();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LE(test::rel_rms(got.data(), want.data(), int64_t(want.size())), 1e-6);
}

// q, k and v stored as one fused projection (rows q | k | v) bind as views of its rows.
TEST(Binding, SplitOneStoredTensorIntoParameters) {
  Tensors t = kda_tensors();
  const auto rows = [&](const std::string& n) { return t.at(n).dim(0); };
  const int64_t q = rows(layer(0) + "attn.q_proj.weight"), k = rows(layer(0) + "attn.k_proj.weight"),
                v = rows(layer(0) + "attn.v_proj.weight");
  for (int i = 0; i < 2; ++i) {
    const std::string p = layer(i) + "attn.";
    const Tensor &tq = t.at(p + "q_proj.weight"), &tk = t.at(p + "k_proj.weight"), &tv = t.at(p + "v_proj.weight");
    Tensor fused = Tensor::empty(DType::F32, {q + k + v, tq.dim(1)});
    std::memcpy(fused.data<float>(), tq.raw(), tq.nbytes());
    std::memcpy(fused.data<float>() + tq.numel(), tk.raw(), tk.nbytes());
    std::memcpy(fused.data<float>() + tq.numel() + tk.numel(), tv.raw(), tv.nbytes());
    for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight"}) t.erase(p + n);
    t[p + "qkv_proj.weight"] = fused;
  }
  const model::Model m = bind_rewritten(t, [&](model::Model& m) {
    m.binding.splits.push_back({".attn.qkv_proj.weight", {{".attn.q_proj.weight", q}, {".attn.k_proj.weight", k},
                                                           {".attn.v_proj.weight", v}}});
  });
  expect_same_logits(m);
  // Without the rule the fused tensor is unexpected and the three parameters missing.
  try {
    bind_rewritten(t, nullptr);
    FAIL() << "bound without the split";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("missing tensors (6)"), std::string::npos) << w;
    EXPECT_NE(w.find("attn.qkv_proj.weight"), std::string::npos) << w;
  }
}

// q, k and v interleaved per head (head h's q rows, then its k rows, then its v rows, as MLA's
// kv_b_proj holds each head's key and value rows) are gathered per part.
TEST(Binding, SplitInterleavedPerHead) {
  Tensors t = kda_tensors();
  const std::string p0 = layer(0) + "attn.";
  const int64_t H = t.at(p0 + "A_log").numel();
  const int64_t q = t.at(p0 + "q_proj.weight").dim(0) / H, k = t.at(p0 + "k_proj.weight").dim(0) / H,
                v = t.at(p0 + "v_proj.weight").dim(0) / H;
  for (int i = 0; i < 2; ++i) {
    const std::string p = layer(i) + "attn.";
    const Tensor &tq = t.at(p + "q_proj.weight"), &tk = t.at(p + "k_proj.weight"), &tv = t.at(p + "v_proj.weight");
    const int64_t D = tq.dim(1);
    Tensor inter = Tensor::empty(DType::F32, {H * (q + k + v), D});
    float* at = inter.data<float>();
    for (int64_t h = 0; h < H; ++h)
      for (auto [src, n] : {std::pair{&tq, q}, {&tk, k}, {&tv, v}}) {
        std::memcpy(at, src->rows(h * n, (h + 1) * n).raw(), size_t(n * D) * sizeof(float));
        at += n * D;
      }
    for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight"}) t.erase(p + n);
    t[p + "qkv_heads.weight"] = inter;
  }
  const model::Model m = bind_rewritten(t, [&](model::Model& m) {
    m.binding.splits.push_back(
        {".attn.qkv_heads.weight", {{".attn.q_proj.weight", q}, {".attn.k_proj.weight", k}, {".attn.v_proj.weight", v}}, H});
  });
  expect_same_logits(m);
}

// An o_proj stored as two row halves is fused into one owned parameter; Kimi's names for fla's
// (f_a_proj for f_proj.0) bind through renames; Kimi's A_log [1, 1, H, 1] binds to [H].
TEST(Binding, FuseRenameSqueeze) {
  Tensors t = kda_tensors();
  for (int i = 0; i < 2; ++i) {
    const std::string p = layer(i) + "attn.";
    const Tensor o = t.at(p + "o_proj.weight");
    const int64_t half = o.dim(0) / 2;
    t[p + "o_proj.top.weight"] = o.rows(0, half).clone();
    t[p + "o_proj.bottom.weight"] = o.rows(half, o.dim(0)).clone();
    t.erase(p + "o_proj.weight");
    t[p + "f_a_proj.weight"] = t.at(p + "f_proj.0.weight");
    t.erase(p + "f_proj.0.weight");
    const Tensor a = t.at(p + "A_log");
    t[p + "A_log"] = a.reshaped({1, 1, a.numel(), 1});
  }
  const model::Model m = bind_rewritten(t, [](model::Model& m) {
    m.binding.fuses.push_back({".attn.o_proj.weight", {".attn.o_proj.top.weight", ".attn.o_proj.bottom.weight"}});
    m.binding.renames.push_back({".attn.f_proj.0.weight", ".attn.f_a_proj.weight"});
  });
  expect_same_logits(m);  // the KDA table squeezes A_log itself (Kimi's checkpoints store it so)
  try {
    bind_rewritten(t, [](model::Model& m) {  // without the squeeze: the stored shape is named
      m.binding.squeeze.clear();
      m.binding.fuses.push_back({".attn.o_proj.weight", {".attn.o_proj.top.weight", ".attn.o_proj.bottom.weight"}});
      m.binding.renames.push_back({".attn.f_proj.0.weight", ".attn.f_a_proj.weight"});
    });
    FAIL() << "bound [1, 1, H, 1] to [H] without the squeeze rule";
  } catch (const Error& e) {
    const int64_t H = kda_tensors().at(layer(0) + "attn.A_log").numel();
    EXPECT_NE(std::string(e.what()).find(cat("A_log: shape [1, 1, ", H, ", 1], expected [", H, "]")), std::string::npos)
        << e.what();
  }
}

// Tensors to ignore (a vision tower by prefix) and parameters the file may leave out.
TEST(Binding, IgnoreAndOptional) {
  Tensors t = kda_tensors();
  t["vision_tower.patch_embed.weight"] = Tensor::zeros(DType::F32, {4, 4});
  const std::string norm = layer(1) + "attn.o_norm.weight";
  t.erase(norm);
  const model::Model m = bind_rewritten(t, [](model::Model& m) {
    m.binding.ignore_prefixes.push_back("vision_tower.");
    m.binding.optional.push_back(".attn.o_norm.weight");
  });
  EXPECT_FALSE(std::get<layers::DeltaRule>(m.blocks[1].mixer).weights.o_norm.defined());
  EXPECT_TRUE(std::get<layers::DeltaRule>(m.blocks[0].mixer).weights.o_norm.defined());
  EXPECT_EQ(std::get<layers::DeltaRule>(m.blocks[1].mixer).prepared.o_norm,
            std::vector<float>(size_t(std::get<layers::DeltaRule>(m.blocks[1].mixer).config.head_v), 1.0f))
      << "an output norm without its weight scales by one";
  EXPECT_EQ(logits(m).size(), reference_logits().size());
  try {
    bind_rewritten(t, nullptr);
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("unexpected tensors (1):\n    vision_tower.patch_embed.weight"), std::string::npos) << w;
    EXPECT_NE(w.find("missing tensors (1):\n    " + norm), std::string::npos) << w;
  }
}

// A matrix declared packed binds the file's weight_packed + weight_scale pair (U8) as one MXFP4
// matrix and multiplies on the packed nibbles: the logits equal those of the same model with the
// matrix's values dequantized into its float tensor (e2m1 · 2^(s−127) is exact in f32). A packed
// matrix whose rows are not whole 32-value blocks, or with scales of another dtype, is an Error.
TEST(Binding, PackedPairBindsAsOneMxfp4Matrix) {
  Tensors t = kda_tensors();
  const std::string p = layer(0) + "mlp.down_proj.weight";
  const int64_t D = t.at(p).dim(0), F = t.at(p).dim(1);
  ASSERT_EQ(F % 32, 0);
  Tensor packed = Tensor::empty(DType::U8, {D, F / 2}), scale = Tensor::empty(DType::U8, {D, F / 32});
  Tensor dense = Tensor::empty(DType::F32, {D, F});
  static const float kE2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  uint32_t r = 12345;
  const auto next = [&] { return (r = r * 1664525u + 1013904223u) >> 24; };
  for (int64_t o = 0; o < D; ++o) {
    for (int64_t b = 0; b < F / 32; ++b) static_cast<uint8_t*>(scale.raw_mut())[o * (F / 32) + b] = uint8_t(118 + next() % 4);
    for (int64_t c = 0; c < F / 2; ++c) static_cast<uint8_t*>(packed.raw_mut())[o * (F / 2) + c] = uint8_t(next());
    for (int64_t c = 0; c < F; ++c) {
      const uint8_t byte = static_cast<const uint8_t*>(packed.raw())[o * (F / 2) + c / 2];
      const uint8_t code = c % 2 ? byte >> 4 : byte & 15;
      const int s = static_cast<const uint8_t*>(scale.raw())[o * (F / 32) + c / 32];
      dense.data<float>()[o * F + c] = (code & 8 ? -1.0f : 1.0f) * kE2m1[code & 7] * std::ldexp(1.0f, s - 127);
    }
  }
  Tensors dequantized = t;
  dequantized[p] = dense;
  t.erase(p);
  t[p + "_packed"] = packed;
  t[p + "_scale"] = scale;
  const auto pack = [](model::Model& m) {
    std::get<layers::GatedMlp>(m.blocks[0].ffn).weights.down_proj.packed = true;
    m.options.bf16_dot = false;  // the exact products, as the dequantized f32 checkpoint's
  };
  const model::Model m = bind_rewritten(t, pack);
  const kernels::Matrix& w = std::get<layers::GatedMlp>(m.blocks[0].ffn).weights.down_proj;
  EXPECT_EQ(w.format(), kernels::MatrixFormat::MXFP4);
  EXPECT_EQ(w.out, D);
  EXPECT_EQ(w.in, F);
  EXPECT_EQ(w.scales.shape(), (Shape{D, F / 32}));
  const std::vector<float> got = logits(m), want = logits(bind_rewritten(dequantized, [](model::Model&) {}));
  EXPECT_LE(test::rel_rms(got.data(), want.data(), int64_t(want.size())), 1e-6);

  t[p + "_scale"] = Tensor::zeros(DType::F32, {D, F / 32});
  try {
    bind_rewritten(t, pack);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_scale: dtype F32, expected U8"), std::string::npos) << e.what();
  }
  try {  // gate_proj's rows hold d_model = 48 values: not whole blocks
    bind_rewritten(t, [](model::Model& m) { std::get<layers::GatedMlp>(m.blocks[0].ffn).weights.gate_proj.packed = true; });
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_proj.weight_packed: an MXFP4 matrix needs rows of whole 32-value blocks"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace binding_test
}  // namespace lineage
