// A corpus of damaged inputs, each run through the built `lineage` binary as a user would meet it:
// exit code 2, no signal, no sanitizer report, and a message on stderr that names the file (or the
// flag) and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "lineage/io/safetensors.h"
#include "lineage/tokenizer/bpe_model.h"
#include "test_support.h"

namespace lineage {
namespace bad_input_cli_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

// The tiny GPT-2 checkpoint's tensors, for headers written by hand.
Tensors tiny_tensors() {
  Tensors t;
  const fs::path dir = test::tiny_gpt2_dir(DType::F32, [&](Tensors& v) { t = v; });
  fs::remove_all(dir);
  return t;
}

// The safetensors header of `tensors` (contiguous data) as JSON, and the data bytes.
json header_of(const Tensors& tensors, std::string& data) {
  json header = json::object();
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                    {"shape", t.shape()},
                    {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.raw()), t.nbytes());
  }
  return header;
}

// A tiny GPT-2 directory whose config.json is `patch` merged into the valid one (null removes a key).
fs::path gpt2_with_config(const json& patch) {
  const fs::path dir = test::tiny_gpt2_dir();
  std::ifstream in(dir / "config.json");
  json cfg = json::parse(in);
  cfg.merge_patch(patch);
  test::write_text(dir / "config.json", cfg.dump());
  return dir;
}

// The same with its safetensors header edited by `edit` (the data left as it was).
fs::path gpt2_with_header(const std::function<void(json&)>& edit, const json& config_patch = json::object()) {
  const fs::path dir = gpt2_with_config(config_patch);
  std::string data;
  json header = header_of(tiny_tensors(), data);
  edit(header);
  test::write_raw_safetensors(dir / "model.safetensors", header.dump(), data);
  return dir;
}

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
std::string nested_in_object(size_t depth) { return "{\"a\": " + nested(depth) + "}"; }

// GPT-2's byte-level vocabulary of the 256 one-byte symbols, as vocab.json holds it.
json byte_vocab() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    tokenizer::append_utf8(symbol, tokenizer::byte_to_code_point(uint8_t(b)));
    vocab[symbol] = b;
  }
  return vocab;
}

// The tiny GPT-2 directory with vocab.json and merges.txt beside it.
fs::path gpt2_with_tokenizer(const json& vocab, const std::string& merges) {
  const fs::path dir = test::tiny_gpt2_dir();
  test::write_text(dir / "vocab.json", vocab.dump());
  test::write_text(dir / "merges.txt", merges);
  return dir;
}

std::string q(const fs::path& p) { return test::shell_quote(p.string()); }
std::string logits_of(const fs::path& dir) { return "logits --model " + q(dir) + " --tokens '1 2 3' --out " + q(dir / "l.npy"); }
std::string tokenize_in(const fs::path& dir) { return "tokenize --model " + q(dir) + " --text 'hello'"; }

struct Case {
  std::string name;
  std::function<std::pair<std::string, std::vector<std::string>>()> make;  // → arguments, pieces of the message
};

const json kKdaConfig = {{"model_type", "kda"}, {"hidden_size", 16}, {"num_heads", 2}, {"head_dim", 8},
                         {"vocab_size", 50}, {"num_hidden_layers", 1}};

// An fla directory: `config` beside a one-tensor placeholder (the config is refused before binding).
fs::path fla_dir(const json& config) {
  const fs::path dir = test::temp_dir();
  test::write_text(dir / "config.json", config.dump());
  test::write_safetensors(dir / "model.safetensors", {{"placeholder", Tensor::zeros(DType::F32, {1})}});
  return dir;
}

json patched(json base, const json& patch) {
  base.merge_patch(patch);
  return base;
}

std::vector<Case> cases() {
  const auto st = [](const fs::path& d) { return (d / "model.safetensors").string(); };
  const auto cfg = [](const fs::path& d) { return (d / "config.json").string(); };
  std::vector<Case> v;
  const auto add = [&](std::string name, std::function<std::pair<std::string, std::vector<std::string>>()> f) {
    v.push_back({std::move(name), std::move(f)});
  };

  // safetensors: sizes that wrap, shapes and offsets that lie.
  add("numel_times_dtype_wraps_onto_real_length", [&] {
    // 2^58 + 32 rows of 16 floats are 2^64 + 2048 bytes, which wraps onto wpe's real 2048.
    const uint64_t rows = (uint64_t(1) << 58) + 32;
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"]["shape"] = {rows, 16}; },
                                        json{{"n_positions", rows}});
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "more bytes than 2^63"}};
  });
  add("numel_overflows_int64", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"]["shape"] = {uint64_t(1) << 62, 4, 2}; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "more bytes than 2^63"}};
  });
  add("shape_dim_negative", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"]["shape"] = {-32, 16}; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "non-negative integers", "-32"}};
  });
  add("shape_dim_not_integer", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"]["shape"] = {32.5, 16}; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "non-negative integers", "32.5"}};
  });
  add("shape_not_array", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"]["shape"] = "32x16"; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "\"shape\" must be an array"}};
  });
  add("shape_missing", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"].erase("shape"); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "dtype, shape and data_offsets"}};
  });
  add("shape_too_many_dims", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["wpe.weight"]["shape"] = std::vector<int>(40, 1); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wpe.weight\"", "40 dims", "at most 16"}};
  });
  add("dtype_missing", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"].erase("dtype"); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "dtype, shape and data_offsets"}};
  });
  add("dtype_unknown", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"]["dtype"] = "F31"; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "dtype \"F31\" is not supported"}};
  });
  add("dtype_not_string", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"]["dtype"] = 4; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "\"dtype\" must be a string"}};
  });
  add("offsets_missing", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"].erase("data_offsets"); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "data_offsets"}};
  });
  add("offsets_reversed", [&] {
    const fs::path d = gpt2_with_header([&](json& h) {
      auto& o = h["wte.weight"]["data_offsets"];
      o = {o[1], o[0]};
    });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"wte.weight\"", "outside the data section"}};
  });
  add("offsets_past_end", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"]["data_offsets"][1] = uint64_t(1) << 40; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "outside the data section"}};
  });
  add("offsets_negative", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"]["data_offsets"][0] = -64; });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "non-negative integers"}};
  });
  add("offsets_three_numbers", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"]["data_offsets"].push_back(0); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "[begin, end]"}};
  });
  add("offsets_overlap", [&] {
    const fs::path d = gpt2_with_header([&](json& h) {
      h["zz"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
    });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "overlaps"}};
  });
  add("offsets_gap", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h.erase("h.0.ln_1.bias"); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "belong to no tensor"}};
  });
  add("entry_not_object", [&] {
    const fs::path d = gpt2_with_header([&](json& h) { h["ln_f.bias"] = json::array({1, 2}); });
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "\"ln_f.bias\"", "expected an object"}};
  });
  add("header_not_object", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_raw_safetensors(d / "model.safetensors", "[1, 2, 3]", "");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "header must be a JSON object", "array"}};
  });
  add("header_not_json", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_raw_safetensors(d / "model.safetensors", "{\"a\": {\"dtype\": ", "");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "not valid JSON"}};
  });
  add("header_nested_100k", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_raw_safetensors(d / "model.safetensors", nested_in_object(100000), "");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "nested more than"}};
  });
  add("header_length_past_end", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_raw_safetensors(d / "model.safetensors", "{}", "", int64_t(1) << 40);
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "header length", "past the end"}};
  });
  add("file_shorter_than_header_length", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "model.safetensors", "abc");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "8-byte header length"}};
  });
  add("file_empty", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "model.safetensors", "");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "empty"}};
  });
  add("trailing_bytes", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    std::string data;
    const json h = header_of(tiny_tensors(), data);
    test::write_raw_safetensors(d / "model.safetensors", h.dump(), data + "trailing");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "trailing bytes"}};
  });
  add("truncated_data", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 100);
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "outside the data section"}};
  });
  add("safetensors_is_directory", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    fs::remove(d / "model.safetensors");
    fs::create_directory(d / "model.safetensors");
    return std::pair{logits_of(d), std::vector<std::string>{st(d), "not a regular file", "a directory"}};
  });

  // Sharded checkpoints.
  const auto sharded = [&](const std::function<void(const fs::path&, json&)>& edit) {
    const fs::path d = test::tiny_gpt2_dir();
    Tensors all = tiny_tensors(), a(all.begin(), all.begin() + 3), b(all.begin() + 3, all.end());
    fs::remove(d / "model.safetensors");
    test::write_safetensors(d / "model-1.safetensors", a);
    test::write_safetensors(d / "model-2.safetensors", b);
    json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
    for (const auto& [n, t] : a) index["weight_map"][n] = "model-1.safetensors";
    for (const auto& [n, t] : b) index["weight_map"][n] = "model-2.safetensors";
    edit(d, index);
    test::write_text(d / "model.safetensors.index.json", index.dump());
    return d;
  };
  const auto idx = [](const fs::path& d) { return (d / "model.safetensors.index.json").string(); };
  add("tensor_in_two_shards", [&] {
    const fs::path d = sharded([](const fs::path& d, json&) {
      Tensors all = tiny_tensors();
      Tensors b(all.begin() + 2, all.end());  // the first shard's last tensor again
      test::write_safetensors(d / "model-2.safetensors", b);
    });
    return std::pair{logits_of(d), std::vector<std::string>{(d / "model-2.safetensors").string(), "is also in",
                                                            "model-1.safetensors"}};
  });
  add("index_names_missing_shard", [&] {
    const fs::path d = sharded([](const fs::path&, json& i) { i["weight_map"]["ln_f.bias"] = "model-9.safetensors"; });
    return std::pair{logits_of(d), std::vector<std::string>{idx(d), "model-9.safetensors", "does not exist"}};
  });
  add("index_shard_leaves_directory", [&] {
    const fs::path d = sharded([](const fs::path&, json& i) { i["weight_map"]["ln_f.bias"] = "../model-1.safetensors"; });
    return std::pair{logits_of(d), std::vector<std::string>{idx(d), "\"ln_f.bias\"", "not a file name in the model directory"}};
  });
  add("index_shard_name_too_long", [&] {
    const fs::path d = sharded([](const fs::path&, json& i) { i["weight_map"]["ln_f.bias"] = std::string(300, 's'); });
    return std::pair{logits_of(d), std::vector<std::string>{idx(d), "which does not exist", "too long"}};
  });
  add("index_wrong_shard_for_tensor", [&] {
    const fs::path d = sharded([](const fs::path&, json& i) { i["weight_map"]["wte.weight"] = "model-2.safetensors"; });
    return std::pair{logits_of(d), std::vector<std::string>{idx(d), "\"wte.weight\"", "does not hold it"}};
  });
  add("index_weight_map_not_object", [&] {
    const fs::path d = sharded([](const fs::path&, json& i) { i["weight_map"] = json::array(); });
    return std::pair{logits_of(d), std::vector<std::string>{idx(d), "\"weight_map\"", "expected an object"}};
  });
  add("index_nested_100k", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "model.safetensors.index.json", nested_in_object(100000));
    return std::pair{logits_of(d), std::vector<std::string>{idx(d), "nested more than"}};
  });

  // config.json: sizes out of range, missing or mistyped fields, and the file itself.
  add("config_layers_huge", [&] {
    const fs::path d = gpt2_with_config({{"n_layer", 1000000000000}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"n_layer\"", "[1, 4096]", "1000000000000"}};
  });
  add("config_layers_more_than_checkpoint", [&] {
    const fs::path d = gpt2_with_config({{"n_layer", 3}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"n_layer\"", "expected 2", "h.0 .. h.1", "found 3"}};
  });
  add("config_heads_zero", [&] {
    const fs::path d = gpt2_with_config({{"n_head", 0}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"n_head\"", "an integer in [1,", "found 0"}};
  });
  add("config_width_not_integer", [&] {
    const fs::path d = gpt2_with_config({{"n_embd", 16.5}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"n_embd\"", "an integer", "16.5"}};
  });
  add("config_eps_zero", [&] {
    const fs::path d = gpt2_with_config({{"layer_norm_epsilon", 0}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"layer_norm_epsilon\"", "finite number in (0, 1]"}};
  });
  add("config_eps_negative", [&] {
    const fs::path d = gpt2_with_config({{"layer_norm_epsilon", -1e-5}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"layer_norm_epsilon\"", "finite number"}};
  });
  add("config_eos_beyond_int32", [&] {
    const fs::path d = gpt2_with_config({{"eos_token_id", int64_t(1) << 40}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"eos_token_id\"", "token id in [0, 50)"}};
  });
  add("config_positions_huge", [&] {
    const fs::path d = gpt2_with_config({{"n_positions", (int64_t(1) << 58) + 32}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"n_positions\"", "an integer in [1,"}};
  });
  add("config_width_left_out_takes_the_default", [&] {
    // HF GPT2Config's n_embd is 768, which the tiny checkpoint's tensors contradict.
    const fs::path d = gpt2_with_config({{"n_embd", nullptr}});
    return std::pair{logits_of(d), std::vector<std::string>{d.string(), "wte.weight: shape [50, 16], expected [50, 768]"}};
  });
  add("config_vocab_not_a_number", [&] {
    const fs::path d = gpt2_with_config({{"vocab_size", "many"}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"vocab_size\"", "\"many\""}};
  });
  add("config_vocab_disagrees_with_checkpoint", [&] {
    const fs::path d = gpt2_with_config({{"vocab_size", 60}});
    return std::pair{logits_of(d), std::vector<std::string>{d.string(), "wte.weight: shape [50, 16], expected [60, 16]"}};
  });
  add("config_model_type_missing", [&] {
    const fs::path d = gpt2_with_config({{"model_type", nullptr}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"model_type\"", "expected a string"}};
  });
  add("config_not_object", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "config.json", "[\"gpt2\"]");
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "expected a JSON object", "array"}};
  });
  add("config_empty", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "config.json", "");
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "is empty"}};
  });
  add("config_nested_100k", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "config.json", "{\"model_type\": \"gpt2\", \"x\": " + nested(100000) + "}");
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "nested more than"}};
  });
  add("config_is_directory", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    fs::remove(d / "config.json");
    fs::create_directory(d / "config.json");
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "is a directory"}};
  });
  add("model_dir_is_file", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    return std::pair{logits_of(d / "config.json"), std::vector<std::string>{cfg(d), "is a file", "model directory"}};
  });
  add("fla_expand_k_zero", [&] {
    const fs::path d = fla_dir({{"model_type", "delta_net"}, {"hidden_size", 16}, {"num_heads", 2}, {"expand_k", 0},
                                {"vocab_size", 50}, {"num_hidden_layers", 1}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"expand_k\"", "finite number in (0, 64]", "0"}};
  });
  add("fla_expand_k_tiny", [&] {
    const fs::path d = fla_dir({{"model_type", "linear_attn"}, {"hidden_size", 16}, {"num_heads", 2}, {"expand_k", 0.01},
                                {"vocab_size", 50}, {"num_hidden_layers", 1}});
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"expand_k\"", "a width in [1,"}};
  });
  add("fla_width_huge", [&] {
    const fs::path d = fla_dir(patched(kKdaConfig, {{"hidden_size", int64_t(1) << 40}}));
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"hidden_size\"", "an integer in [1, 1048576]"}};
  });
  add("fla_norm_eps_negative", [&] {
    const fs::path d = fla_dir(patched(kKdaConfig, {{"norm_eps", -1}}));
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"norm_eps\"", "finite number"}};
  });
  add("fla_heads_zero", [&] {
    const fs::path d = fla_dir(patched(kKdaConfig, {{"num_heads", 0}}));
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"num_heads\"", "an integer in [1,"}};
  });
  add("fla_conv_size_huge", [&] {
    const fs::path d = fla_dir(patched(kKdaConfig, {{"conv_size", 1 << 30}}));
    return std::pair{logits_of(d), std::vector<std::string>{cfg(d), "\"conv_size\"", "an integer in [1, 1024]"}};
  });

  // Tokenizer files.
  add("vocab_id_above_2_24", [&] {
    json vocab = byte_vocab();
    vocab["hello"] = 1 << 25;
    const fs::path d = gpt2_with_tokenizer(vocab, "#version: 0.2\n");
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "vocab.json").string(), "\"hello\"", "token id"}};
  });
  add("vocab_id_duplicated", [&] {
    json vocab = byte_vocab();
    vocab["he"] = 7;
    const fs::path d = gpt2_with_tokenizer(vocab, "#version: 0.2\n");
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "vocab.json").string(), "7"}};
  });
  add("merges_name_unknown_token", [&] {
    const fs::path d = gpt2_with_tokenizer(byte_vocab(), "#version: 0.2\nzz q\n");
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "merges.txt").string(), "\"zz\"", "not in the vocabulary"}};
  });
  add("vocab_nested_100k", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "vocab.json", nested_in_object(100000));
    test::write_text(d / "merges.txt", "#version: 0.2\n");
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "vocab.json").string(), "nested more than"}};
  });
  add("tokenizer_json_nested_100k", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "tokenizer.json", nested_in_object(100000));
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "tokenizer.json").string(), "nested more than"}};
  });
  add("tokenizer_config_nested_100k", [&] {
    const fs::path d = gpt2_with_tokenizer(byte_vocab(), "#version: 0.2\n");
    test::write_text(d / "tokenizer_config.json", nested_in_object(100000));
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "tokenizer_config.json").string(), "nested more than"}};
  });
  add("tokenizer_json_empty", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "tokenizer.json", "");
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "tokenizer.json").string(), "is empty"}};
  });
  add("merges_is_directory", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    test::write_text(d / "vocab.json", byte_vocab().dump());
    fs::create_directory(d / "merges.txt");
    return std::pair{tokenize_in(d), std::vector<std::string>{(d / "merges.txt").string(), "is a directory"}};
  });

  // Non-finite weights.
  const auto with_nan = [](const std::string& tensor, float value) {
    return test::tiny_gpt2_dir(DType::F32, [&](Tensors& t) {
      for (auto& [n, x] : t)
        if (n == tensor) {
          x = x.clone();
          static_cast<float*>(x.raw_mut())[3] = value;
        }
    });
  };
  add("nan_weight_check_tensors", [&] {
    const fs::path d = with_nan("h.1.mlp.c_fc.weight", std::nanf(""));
    return std::pair{logits_of(d) + " --check-tensors",
                     std::vector<std::string>{d.string(), "\"h.1.mlp.c_fc.weight\"", "NaN or Inf at element 3"}};
  });
  add("inf_weight_logits_error", [&] {
    const fs::path d = with_nan("ln_f.weight", INFINITY);
    return std::pair{logits_of(d), std::vector<std::string>{"logits at position 0", "--check-tensors"}};
  });
  add("nan_weight_generate_error", [&] {
    const fs::path d = with_nan("h.0.ln_1.bias", std::nanf(""));
    test::write_text(d / "vocab.json", byte_vocab().dump());
    test::write_text(d / "merges.txt", "#version: 0.2\n");
    // "01" is bytes 48 and 49, inside the tiny vocabulary of 50.
    return std::pair{"generate --model " + q(d) + " --prompt '01' --max-tokens 3",
                     std::vector<std::string>{"logits at position 1", "not finite"}};
  });

  // Quantized checkpoints: a copy of the reference's compressed-tensors int4 case, damaged.
  const auto quantized = [](const std::function<void(Tensors&, json&)>& edit) {
    const fs::path src = test::testdata() / "quant" / "w4a16_g32", d = test::temp_dir();
    std::ifstream in(src / "config.json");
    json config = json::parse(in);
    Tensors t;
    const io::Checkpoint ck = io::Checkpoint::open(src);
    for (const auto& n : ck.names()) t.push_back({n, ck.tensor(n).clone()});
    edit(t, config);
    test::write_text(d / "config.json", config.dump());
    test::write_safetensors(d / "model.safetensors", t);
    return d;
  };
  const std::string kDown = "model.layers.1.mlp.experts.3.down_proj.weight";
  // (by value: the cases run after this function returns)
  add("quantized_nan_scale", [=] {
    const fs::path d = quantized([=](Tensors& t, json&) {
      for (auto& [n, x] : t)
        if (n == kDown + "_scale") static_cast<uint16_t*>(x.raw_mut())[1] = 0x7fc0;
    });
    return std::pair{logits_of(d), std::vector<std::string>{d.string(), kDown + "_scale", "not finite"}};
  });
  add("quantized_unknown_format", [=] {
    const fs::path d = quantized([](Tensors&, json& c) { c["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"; });
    return std::pair{logits_of(d), std::vector<std::string>{"config_groups.group_0", "\"marlin-24\" is not supported"}};
  });
  add("quantized_scale_shape", [=] {
    const fs::path d = quantized([=](Tensors& t, json&) {
      for (auto& [n, x] : t)
        if (n == kDown + "_scale") x = Tensor::zeros(DType::BF16, {64, 3});
    });
    return std::pair{logits_of(d), std::vector<std::string>{kDown + "_scale", "shape [64, 3], expected [64, 1]"}};
  });
  add("quantized_config_quantizes_a_float_tensor", [=] {
    const fs::path d = quantized([](Tensors&, json& c) { c["quantization_config"]["ignore"] = json::array({"lm_head"}); });
    return std::pair{logits_of(d), std::vector<std::string>{"mlp.gate.weight", "stored unquantized", "config_groups.group_0"}};
  });

  // Command-line values.
  add("token_id_beyond_int32", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    return std::pair{"logits --model " + q(d) + " --tokens '1 4294967296' --out " + q(d / "l.npy"),
                     std::vector<std::string>{"--tokens", "\"4294967296\"", "not a token id"}};
  });
  add("token_id_beyond_vocab", [&] {
    const fs::path d = test::tiny_gpt2_dir();
    return std::pair{"logits --model " + q(d) + " --tokens '1 50' --out " + q(d / "l.npy"),
                     std::vector<std::string>{"token id 50", "[0, 50)"}};
  });
  return v;
}

TEST(BadInputCorpus, EveryDamagedInputExitsTwoWithAMessage) {
  const std::vector<Case> all = cases();
  EXPECT_GE(all.size(), 40u);
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const auto [args, pieces] = c.make();
    const test::RunResult r = test::run_lineage(args);
    EXPECT_EQ(r.exit_code, 2) << "stderr:\n" << r.err;  // a signal reads as -1
    EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("runtime error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("lineage: error: "), std::string::npos) << r.err;
    for (const std::string& p : pieces) EXPECT_NE(r.err.find(p), std::string::npos) << "lacks \"" << p << "\":\n" << r.err;
  }
}

}  // namespace
}  // namespace bad_input_cli_test
}  // namespace lineage

namespace lineage {
namespace bad_input_cli_test {
namespace {

// A checkpoint truncated while `bench` decodes from its mapping: the next read of a vanished page
// is SIGBUS, which the binary turns into an error naming the file (exit 2), not a crash.
TEST(BadInputCorpus, FileThatShrinksWhileMappedIsNamed) {
  const fs::path dir = test::temp_dir();
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(test::testdata() / "kda" / "f32" / f, dir / f);
  const fs::path weights = dir / "model.safetensors", err = dir / "err", rc = dir / "rc";
  // The bench runs for minutes unless stopped; the file shrinks to its header after 1.5 s.
  const std::string script =
      "timeout 120 " + test::shell_quote(test::lineage_bin()) + " bench --model " + q(dir) +
      " --prompt 2048 --gen 2048 --repetitions 1000 --threads 1 >/dev/null 2>" + q(err) + " & p=$!; sleep 1.5; "
      "truncate -s 4096 " + q(weights) + "; wait $p; echo $? >" + q(rc);
  ASSERT_EQ(std::system(("bash -c " + test::shell_quote(script)).c_str()), 0);
  std::ifstream rc_in(rc), err_in(err);
  int code = -1;
  rc_in >> code;
  const std::string msg((std::istreambuf_iterator<char>(err_in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(code, 2) << msg;
  EXPECT_NE(msg.find("lineage: error: " + weights.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("changed while its weights were mapped"), std::string::npos) << msg;
}

}  // namespace
}  // namespace bad_input_cli_test
}  // namespace lineage
