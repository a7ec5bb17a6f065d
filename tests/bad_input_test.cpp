// Bad input is rejected with an Error whose message names the file, the field and the problem.
#include <gtest/gtest.h>

#include <fstream>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/runtime/session.h"
#include "test_support.h"

namespace lineage {
namespace bad_input_test {
namespace {

namespace fs = std::filesystem;

// Runs f, expects an Error, and checks that every piece appears in its message.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> pieces) {
  try {
    f();
    ADD_FAILURE() << "expected lineage::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\":\n" << msg;
  }
}

Tensor f32(Shape s) { return Tensor::zeros(DType::F32, std::move(s)); }

TEST(BadInput, TinyCheckpointLoads) {
  const fs::path dir = test::tiny_gpt2_dir();
  io::LoadedModel m = io::load_model(dir, false);
  EXPECT_EQ(m.model.n_layers(), 2);
  EXPECT_TRUE(m.model.embed.is_borrowed());  // mapped, not copied
}

TEST(BadInput, TruncatedFile) {
  const fs::path dir = test::tiny_gpt2_dir();
  const fs::path f = dir / "model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 10);
  expect_error([&] { io::load_model(dir, false); }, {f.string(), "outside the data section"});
}

TEST(BadInput, HeaderLengthPastEnd) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_raw_safetensors(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd", 1 << 20);
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "header length", "past the end"});
}

TEST(BadInput, TooShortForHeaderLength) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_text(f, "abc");
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "8-byte header length"});
}

TEST(BadInput, MalformedHeaderJson) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_raw_safetensors(f, R"({"a":{"dtype":"F32",)", "");
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "not valid JSON"});
}

TEST(BadInput, OverlappingOffsets) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_raw_safetensors(f,
                              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                              std::string(12, '\0'));
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "\"b\"", "overlaps"});
}

TEST(BadInput, GapBetweenOffsets) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_raw_safetensors(f,
                              R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                              std::string(12, '\0'));
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "belong to no tensor"});
}

TEST(BadInput, ByteLengthDoesNotMatchShape) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_raw_safetensors(f, R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "\"a\"", "holds 8 bytes", "[3]", "needs 6"});
}

TEST(BadInput, UnknownDtype) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  test::write_raw_safetensors(f, R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'));
  expect_error([&] { io::SafetensorsFile s(f); }, {f.string(), "dtype \"F7\""});
}

TEST(BadInput, MisalignedTensorsAreCopiedAligned) {
  // A header of 8k + 2 bytes puts the data section 2 bytes past a 4-byte boundary.
  const fs::path f = test::temp_dir() / "x.safetensors";
  std::string header = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  while ((8 + header.size()) % 4 != 2) header += ' ';
  const float values[3] = {1.5f, -2.0f, 3.25f};
  test::write_raw_safetensors(f, "", "", int64_t(header.size()));  // the length only
  {
    std::ofstream out(f, std::ios::binary | std::ios::app);
    out << header;
    out.write(reinterpret_cast<const char*>(values), sizeof values);
  }
  io::SafetensorsFile s(f);
  const Tensor t = s.tensor("a");
  EXPECT_FALSE(t.is_borrowed());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % alignof(float), 0u);
  EXPECT_EQ(std::vector<float>(t.data<float>(), t.data<float>() + 3), std::vector<float>(values, values + 3));
}

TEST(BadInput, AcceptsEveryStandardDtype) {
  const fs::path f = test::temp_dir() / "x.safetensors";
  std::vector<std::pair<std::string, Tensor>> t;
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16, DType::I8,
                  DType::U8, DType::Bool})
    t.emplace_back(std::string(dtype_name(d)), Tensor::zeros(d, {2, 3}));
  test::write_safetensors(f, t);
  io::SafetensorsFile s(f);
  ASSERT_EQ(s.entries().size(), 10u);
  EXPECT_EQ(s.entries().at("BF16").dtype, DType::BF16);
  EXPECT_EQ(s.tensor("I64").nbytes(), 48u);
}

TEST(BadInput, MissingAndUnexpectedTensorsInOneError) {
  const fs::path dir = test::tiny_gpt2_dir(DType::F32, [](auto& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "h.1.mlp.c_fc.weight" || p.first == "ln_f.bias"; });
    t.emplace_back("h.0.attn.extra", f32({4}));
  });
  expect_error([&] { io::load_model(dir, false); },
               {dir.string(), "missing tensors (2)", "h.1.mlp.c_fc.weight [16, 64]", "ln_f.bias", "unexpected tensors (1)",
                "h.0.attn.extra"});
}

TEST(BadInput, WrongShapeAndDtype) {
  const fs::path dir = test::tiny_gpt2_dir(DType::F32, [](auto& t) {
    for (auto& [name, tensor] : t) {
      if (name == "wpe.weight") tensor = f32({31, 16});
      if (name == "h.0.ln_1.weight") tensor = Tensor::zeros(DType::I32, {16});
    }
  });
  expect_error([&] { io::load_model(dir, false); },
               {"wpe.weight: shape [31, 16], expected [32, 16]", "h.0.ln_1.weight: dtype I32"});
}

TEST(BadInput, BuffersAreIgnoredWhateverTheirDtype) {
  const fs::path dir = test::tiny_gpt2_dir(DType::BF16, [](auto& t) {
    t.emplace_back("h.0.attn.bias", Tensor::zeros(DType::Bool, {1, 1, 32, 32}));
    t.emplace_back("h.1.attn.bias", Tensor::zeros(DType::U8, {1, 1, 32, 32}));
    t.emplace_back("h.0.attn.masked_bias", f32({}));
  });
  EXPECT_NO_THROW(io::load_model(dir, false));
}

TEST(BadInput, MalformedConfigJson) {
  const fs::path dir = test::tiny_gpt2_dir();
  test::write_text(dir / "config.json", "{\"model_type\": \"gpt2\", ");
  expect_error([&] { io::load_model(dir, false); }, {(dir / "config.json").string(), "not valid JSON"});
}

TEST(BadInput, UnknownModelType) {
  const fs::path dir = test::tiny_gpt2_dir();
  test::write_text(dir / "config.json", R"({"model_type": "llama"})");
  expect_error([&] { io::load_model(dir, false); }, {"config.json", "\"model_type\"", "\"llama\" is not supported", "gpt2"});
}

TEST(BadInput, BadConfigField) {
  const fs::path dir = test::tiny_gpt2_dir();
  test::write_text(dir / "config.json",
                   R"({"model_type": "gpt2", "vocab_size": 50, "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 3})");
  expect_error([&] { io::load_model(dir, false); }, {"config.json", "\"n_head\"", "divisor of n_embd = 16", "3"});
  test::write_text(dir / "config.json", R"({"model_type": "gpt2", "vocab_size": "many", "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 2})");
  expect_error([&] { io::load_model(dir, false); }, {"\"vocab_size\"", "integer", "\"many\""});
}

TEST(BadInput, ContextOverNPositions) {
  io::LoadedModel m = io::load_model(test::tiny_gpt2_dir(), false);
  runtime::Session s(m.model);
  s.prefill(std::vector<int32_t>(30, 1));
  expect_error([&] { s.prefill(std::vector<int32_t>(3, 1)); }, {"33 tokens", "limit of 32", "n_positions"});
  EXPECT_EQ(s.position(), 30);  // the rejected call left the state as it was
  s.prefill(std::vector<int32_t>(2, 1));
  EXPECT_EQ(s.position(), 32);
}

TEST(BadInput, TokenOutsideVocabulary) {
  io::LoadedModel m = io::load_model(test::tiny_gpt2_dir(), false);
  runtime::Session s(m.model);
  expect_error([&] { s.prefill(std::vector<int32_t>{1, 50}); }, {"token id 50", "position 1", "[0, 50)"});
  expect_error([&] { s.decode(-3); }, {"token id -3"});
}

TEST(BadInput, MissingDirectoryAndFiles) {
  expect_error([&] { io::load_model("/nonexistent/model", false); }, {"/nonexistent/model", "does not exist"});
  const fs::path dir = test::temp_dir();
  test::write_text(dir / "config.json", R"({"model_type": "gpt2"})");
  expect_error([&] { io::load_model(dir, false); }, {dir.string(), "no model.safetensors"});
}

TEST(BadInput, ShardIndexProblems) {
  const fs::path dir = test::tiny_gpt2_dir();
  fs::rename(dir / "model.safetensors", dir / "model-00001-of-00002.safetensors");
  test::write_text(dir / "model.safetensors.index.json",
                   R"({"weight_map": {"wte.weight": "model-00001-of-00002.safetensors", "wpe.weight": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { io::load_model(dir, false); }, {"model.safetensors.index.json", "model-00002-of-00002.safetensors"});
}

}  // namespace
}  // namespace bad_input_test
}  // namespace lineage

namespace lineage {
namespace bad_input_test {
namespace {

// An fla config.json next to a placeholder checkpoint: the config is rejected before any tensor is bound.
fs::path fla_dir(const std::string& config) {
  const fs::path dir = test::temp_dir();
  test::write_text(dir / "config.json", config);
  test::write_safetensors(dir / "model.safetensors", {{"placeholder", Tensor::zeros(DType::F32, {1})}});
  return dir;
}

TEST(BadInput, FlaConfigsThatDoNotDivide) {
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "delta_net", "hidden_size": 48, "num_heads": 5, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"config.json", "\"expand_k\"", "divisible by 5 heads"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "gated_deltanet", "hidden_size": 48, "num_heads": 4, "num_v_heads": 6, "head_dim": 8, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"num_v_heads\"", "a multiple of num_heads = 4", "6"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "linear_attn", "hidden_size": 48, "num_heads": 4, "num_kv_heads": 3, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"num_kv_heads\"", "divisor of num_heads = 4"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "kda", "hidden_size": 48, "num_heads": 4, "head_dim": 8, "expand_v": 1.3, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"expand_v\"", "whole value head dim"});
}

TEST(BadInput, FlaUnknownFeatureMapActivationAndGate) {
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "linear_attn", "feature_map": "hedgehog", "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"feature_map\"", "\"hedgehog\"", "elementwise_product"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "delta_net", "qk_activation": "tanh", "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"qk_activation\"", "\"tanh\""});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "delta_net", "qk_norm": "max", "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"qk_norm\"", "\"l2\" or \"sum\""});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "kda", "lower_bound": 5, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"lower_bound\"", ", 0)"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "kda", "safe_gate": true, "lower_bound": -8, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"safe_gate\"", "[-5, 0)"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "gated_deltanet", "attn": {"layers": [1]}, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"attn\"", "hybrid softmax-attention layers are not supported"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "kda", "attnres_block_size": 3, "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"attnres_block_size\"", "an even number of sublayers"});
  expect_error([] { io::load_model(fla_dir(R"({"model_type": "kda", "hidden_act": "gelu", "vocab_size": 10, "num_hidden_layers": 1})"), false); },
               {"\"hidden_act\"", "swish"});
}

}  // namespace
}  // namespace bad_input_test
}  // namespace lineage
