#include "lineage/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/rng.h"
#include "lineage/core/json_read.h"
#include "lineage/io/safetensors.h"
#include "lineage/model/accounting.h"
#include "lineage/tokenizer/tokenizer.h"
#include "lineage/plot/svg_plot.h"

namespace lineage::train {

namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  if (!f) throw Error(cat(p.string(), ": cannot be written"));
}

}  // namespace

std::vector<int32_t> decode_bin(const std::string& bytes, int64_t vocab, const fs::path& file) {
  const size_t width = vocab <= 65536 ? 2 : 4;
  if (bytes.size() % width)
    throw Error(cat(file.string(), ": a .bin file holds little-endian uint", 8 * width, " token ids; its ", bytes.size(),
                    " bytes are not a whole number of them"));
  std::vector<int32_t> ids(bytes.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    for (size_t b = 0; b < width; ++b) v |= uint32_t(uint8_t(bytes[i * width + b])) << (8 * b);
    if (int64_t(v) >= vocab)
      throw Error(cat(file.string(), ": token ", i, " is id ", v, ", outside the model's vocabulary of ", vocab));
    ids[i] = int32_t(v);
  }
  return ids;
}

TokenData load_tokens(const fs::path& file, const tokenizer::Tokenizer* tokenizer, int64_t vocab, double val_fraction,
                      int64_t seq_len) {
  const std::string bytes = read_file_text(file);
  std::vector<int32_t> ids;
  if (file.extension() == ".bin") {
    ids = decode_bin(bytes, vocab, file);
  } else {
    if (!tokenizer)
      throw Error(cat(file.string(), ": text needs a tokenizer (--tokenizer DIR, or a --model directory with one); "
                      "pre-tokenized data goes in a .bin file"));
    ids = tokenizer->encode(bytes, false);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] >= vocab)
        throw Error(cat(file.string(), ": the tokenizer gives id ", ids[i], ", outside the model's vocabulary of ", vocab));
  }
  if (!(val_fraction >= 0 && val_fraction < 1))
    throw Error(cat("--val-fraction: expected a number in [0, 1), got ", val_fraction));
  const auto n_val = int64_t(double(ids.size()) * val_fraction);
  TokenData d;
  d.train.assign(ids.begin(), ids.end() - n_val);
  d.val.assign(ids.end() - n_val, ids.end());
  if (int64_t(d.train.size()) < seq_len + 1)
    throw Error(cat(file.string(), ": ", d.train.size(), " training tokens, fewer than one sequence of --seq-len ",
                    seq_len, " + 1"));
  if (n_val > 0 && n_val < seq_len + 1)
    throw Error(cat(file.string(), ": the held-out split (--val-fraction ", val_fraction, ") has ", n_val,
                    " tokens, fewer than one sequence of --seq-len ", seq_len, " + 1"));
  return d;
}

Trainer::Trainer(model::Model& m, const TrainConfig& c, TokenData data)
    : m_(m), c_(c), data_(std::move(data)), bp_(m) {
  params_ = bp_.params();
  opt_ = AdamW(params_);
}

void Trainer::fill_batch(const std::vector<int32_t>& src, uint64_t stream, int64_t index,
                         std::vector<int32_t>& out) const {
  const int64_t B = c_.batch, T = c_.seq_len, span = int64_t(src.size()) - T - 1;
  out.resize(size_t(B * (T + 1)));
  Rng rng(stream * 0x9e3779b97f4a7c15ull + uint64_t(index) * 0xd1b54a32d192ed03ull);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t at = span <= 0 ? 0 : int64_t(rng.next_u64() % uint64_t(span + 1));
    std::copy_n(src.begin() + at, T + 1, out.begin() + b * (T + 1));
  }
}

LogRow Trainer::step() {
  const int64_t s = opt_.steps();
  bp_.zero_grads();
  const float scale = 1.0f / float(c_.batch * c_.seq_len * c_.accum);
  double loss = 0;
  for (int64_t a = 0; a < c_.accum; ++a) {
    fill_batch(data_.train, c_.seed, s * c_.accum + a, batch_);
    loss += bp_.step(batch_, c_.batch, c_.seq_len, scale);
  }
  const double norm = grad_norm(params_);
  const float clip = c_.grad_clip > 0 && norm > c_.grad_clip ? float(c_.grad_clip / norm) : 1.0f;
  const double lr = schedule_lr(s, c_.steps, c_.warmup, c_.lr, c_.min_lr);
  opt_.step(params_, c_.adam, lr, clip);
  bp_.refresh();
  tokens_ += c_.batch * c_.seq_len * c_.accum;
  LogRow row{s + 1, tokens_, lr, loss, norm, std::nullopt};
  const bool last = s + 1 == c_.steps;
  if (!data_.val.empty() && (last || (c_.eval_every > 0 && (s + 1) % c_.eval_every == 0))) row.val_loss = evaluate();
  log_.push_back(row);
  return row;
}

double Trainer::evaluate() {
  const int64_t B = c_.batch, T = c_.seq_len, span = int64_t(data_.val.size()) - T - 1;
  const int64_t windows = B * c_.eval_batches;
  const float scale = 1.0f / float(B * T * c_.eval_batches);
  double loss = 0;
  for (int64_t e = 0; e < c_.eval_batches; ++e) {
    batch_.resize(size_t(B * (T + 1)));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t w = e * B + b, at = windows > 1 ? span * w / (windows - 1) : 0;
      std::copy_n(data_.val.begin() + at, T + 1, batch_.begin() + b * (T + 1));
    }
    loss += bp_.step(batch_, B, T, scale, false);
  }
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints.

namespace {

constexpr const char* kTokenizerFiles[] = {"tokenizer.json",          "vocab.json",        "merges.txt",
                                           "tiktoken.model",          "tokenizer_config.json",
                                           "special_tokens_map.json", "chat_template.jinja", "generation_config.json"};

std::string csv(const std::vector<LogRow>& log) {
  std::ostringstream s;
  s << std::setprecision(9) << "step,tokens,lr,train_loss,grad_norm,val_loss\n";
  for (const LogRow& r : log) {
    s << r.step << ',' << r.tokens << ',' << r.lr << ',' << r.loss << ',' << r.grad_norm << ',';
    if (r.val_loss) s << *r.val_loss;
    s << '\n';
  }
  return s.str();
}

}  // namespace

std::vector<LogRow> parse_loss_csv(const std::string& text, const fs::path& file) {
  std::vector<LogRow> rows;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
    if (line.back() == ',') f.emplace_back();
    if (f.size() != 6) throw Error(cat(file.string(), ": malformed row \"", line, "\" (expected 6 columns)"));
    try {
      LogRow r{std::stoll(f[0]), std::stoll(f[1]), std::stod(f[2]), std::stod(f[3]), std::stod(f[4]), std::nullopt};
      if (!f[5].empty()) r.val_loss = std::stod(f[5]);
      rows.push_back(r);
    } catch (const std::exception&) {
      throw Error(cat(file.string(), ": malformed row \"", line, "\""));
    }
  }
  return rows;
}

namespace {

std::string loss_svg(const std::vector<LogRow>& log) {
  plot::PlotSeries train{"train loss", {}, false}, val{"held-out loss", {}, true};
  for (const LogRow& r : log) {
    train.points.emplace_back(double(r.step), r.loss);
    if (r.val_loss) val.points.emplace_back(double(r.step), *r.val_loss);
  }
  plot::PlotSpec spec;
  spec.title = "lineage train: loss";
  spec.x_label = "optimizer step";
  spec.y_label = "cross-entropy (nats / token)";
  spec.id = "loss";
  std::vector<plot::PlotSeries> series{train};
  if (!val.points.empty()) series.push_back(val);
  return plot::svg_line_plot(spec, series);
}

}  // namespace

void Trainer::save(const fs::path& dir, const std::string& config_json,
                   const std::optional<fs::path>& tokenizer_dir) const {
  fs::create_directories(dir);
  write_file(dir / "config.json", config_json);
  std::vector<std::pair<std::string, Tensor>> params, moments;
  size_t i = 0;
  m_.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    params.emplace_back(name, c_.save_dtype == DType::F32 ? t : convert(t, c_.save_dtype));
    moments.emplace_back("exp_avg." + name, Tensor::borrow(DType::F32, t.shape(), opt_.m()[i].data(), nullptr));
    moments.emplace_back("exp_avg_sq." + name, Tensor::borrow(DType::F32, t.shape(), opt_.v()[i].data(), nullptr));
    ++i;
  });
  // In the family's own layout (model/binding.h): Qwen's joined projections, fused experts.
  io::save_safetensors(dir / "model.safetensors", model::stored_tensors(m_.binding, params));
  io::save_safetensors(dir / "optimizer.safetensors", moments);
  if (tokenizer_dir && fs::absolute(*tokenizer_dir) != fs::absolute(dir))
    for (const char* f : kTokenizerFiles)
      if (fs::exists(*tokenizer_dir / f)) fs::copy_file(*tokenizer_dir / f, dir / f, fs::copy_options::overwrite_existing);
  const nlohmann::json state = {{"step", opt_.steps()},
                                {"tokens", tokens_},
                                {"steps", c_.steps},
                                {"seed", c_.seed},
                                {"batch", c_.batch},
                                {"seq_len", c_.seq_len},
                                {"accum", c_.accum},
                                {"lr", c_.lr},
                                {"min_lr", c_.min_lr},
                                {"warmup", c_.warmup},
                                {"weight_decay", c_.adam.weight_decay},
                                {"beta1", c_.adam.beta1},
                                {"beta2", c_.adam.beta2},
                                {"eps", c_.adam.eps},
                                {"grad_clip", c_.grad_clip},
                                {"tensors_hash", model::identity(m_).tensors_hash}};
  write_file(dir / "trainer_state.json", state.dump(2) + "\n");
  write_file(dir / "loss.csv", csv(log_));
  if (!log_.empty()) write_file(dir / "loss.svg", loss_svg(log_) + "\n");
}

void Trainer::resume(const fs::path& dir) {
  const fs::path state_file = dir / "trainer_state.json";
  const nlohmann::json state = read_json_file(state_file);
  if (!state.contains("step") || !state["step"].is_number_integer() || !state.contains("tokens") ||
      !state["tokens"].is_number_integer())
    throw Error(cat(state_file.string(), ": fields \"step\" and \"tokens\" must be integers"));
  if (!state.contains("tensors_hash") || state["tensors_hash"] != model::identity(m_).tensors_hash)
    throw Error(cat(state_file.string(), ": field \"tensors_hash\" does not match this model's tensors"));
  const io::SafetensorsFile moments(dir / "optimizer.safetensors");
  size_t i = 0;
  m_.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    for (const char* kind : {"exp_avg.", "exp_avg_sq."}) {
      const std::string key = kind + name;
      if (!moments.entries().count(key))
        throw Error(cat((dir / "optimizer.safetensors").string(), ": tensor \"", key, "\" is missing"));
      const Tensor src = moments.tensor(key);
      if (src.dtype() != DType::F32 || src.shape() != t.shape())
        throw Error(cat((dir / "optimizer.safetensors").string(), ": tensor \"", key, "\" is ", dtype_name(src.dtype()), " ",
                        shape_str(src.shape()), ", expected F32 ", shape_str(t.shape())));
      auto& dst = std::string(kind) == "exp_avg." ? opt_.m()[i] : opt_.v()[i];
      std::memcpy(dst.data(), src.raw(), src.nbytes());
    }
    ++i;
  });
  opt_.set_steps(state["step"].get<int64_t>());
  tokens_ = state["tokens"].get<int64_t>();
  if (fs::exists(dir / "loss.csv")) {
    log_ = parse_loss_csv(read_file_text(dir / "loss.csv"), dir / "loss.csv");
    while (!log_.empty() && log_.back().step > opt_.steps()) log_.pop_back();
  }
}

}  // namespace lineage::train
