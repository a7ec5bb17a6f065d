// `lineage study memory`: its three experiments and their text, JSON and HTML report; over 400
// lines, one concept: one study, end to end.
#include "lineage/study/memory.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/delta_rule.h"
#include "lineage/plot/svg_plot.h"

namespace lineage::study {

const char* rule_name(WriteRule r) {
  switch (r) {
    case WriteRule::Additive: return "additive";
    case WriteRule::Delta: return "delta";
    case WriteRule::GatedDelta: return "gated-delta";
    case WriteRule::PerChannel: return "kda";
  }
  return "?";
}

const char* rule_write(WriteRule r) {
  switch (r) {
    case WriteRule::Additive: return "S += k vT";
    case WriteRule::Delta: return "S += k (v - ST k)T";
    case WriteRule::GatedDelta: return "S *= a, then delta";
    case WriteRule::PerChannel: return "S = diag(a) S, then delta";
  }
  return "?";
}

const char* rule_forget(WriteRule r) {
  switch (r) {
    case WriteRule::Additive: return "never";
    case WriteRule::Delta: return "by overwriting a key";
    case WriteRule::GatedDelta: return "scalar decay";
    case WriteRule::PerChannel: return "per-channel decay";
  }
  return "?";
}

const char* fact_key_name(FactKey k) {
  switch (k) {
    case FactKey::Slow: return "slow channels";
    case FactKey::Fast: return "fast channels";
    case FactKey::Any: return "all channels";
  }
  return "?";
}

namespace {

constexpr FactKey kFactKeys[] = {FactKey::Slow, FactKey::Fast, FactKey::Any};

uint64_t stream_seed(std::string_view experiment, uint64_t seed, int64_t a, int64_t b, int64_t c) {
  return Hasher().add(experiment).add(&seed, 8).add(&a, 8).add(&b, 8).add(&c, 8).value();
}

// A random unit vector (a normalized Gaussian) over channels [c0, c1) of x [d]; the rest zero.
void random_unit(Rng& rng, float* x, int64_t d, int64_t c0, int64_t c1) {
  std::fill_n(x, d, 0.0f);
  double norm = 0;
  for (int64_t i = c0; i < c1; ++i) x[i] = rng.normal(), norm += double(x[i]) * x[i];
  norm = std::sqrt(norm);
  for (int64_t i = c0; i < c1; ++i) x[i] = float(x[i] / norm);
}

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

// f32 dot product in eight independent lanes (so the compiler can keep them in vector registers); a
// fixed order, so the same bits on every thread.
float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The steps of one experiment for H independent heads of width D on one schedule: step t writes
// (k_t, v_t), or reads (q_t = the key asked about, k = v = 0 and no decay, so S is unchanged and
// o_t = Sᵀq_t).
struct Tape {
  int64_t T = 0, H = 0, D = 0;
  std::vector<uint8_t> writes;  // [T]: 1 write, 0 read
  std::vector<float> q, k, v;   // [T, H, D] each
  Tape(int64_t t, int64_t h, int64_t d)
      : T(t), H(h), D(d), writes(size_t(t), 0), q(size_t(t * h * d)), k(q.size()), v(q.size()) {}
  float* at(std::vector<float>& x, int64_t t, int64_t h) { return x.data() + (t * H + h) * D; }
};

// The tape through delta_rule_recurrent under rule r from S = 0. Returns o [T, H, D].
std::vector<float> play(const Tape& tp, WriteRule r, const DecaySetup& d) {
  kernels::DeltaRuleArgs a;
  a.T = tp.T, a.H = a.HV = tp.H, a.K = a.V = tp.D;
  a.delta = r != WriteRule::Additive;
  a.scale = 1.0f;
  a.q = tp.q.data(), a.k = tp.k.data(), a.v = tp.v.data();
  const double D = double(tp.D);
  std::vector<float> g;
  if (r == WriteRule::GatedDelta) {
    a.gate = kernels::Gate::PerHead;
    g.assign(size_t(tp.T * tp.H), 0.0f);
    for (int64_t t = 0; t < tp.T; ++t)
      if (tp.writes[size_t(t)]) std::fill_n(g.begin() + t * tp.H, tp.H, float(-1 / (d.scalar_lifetime() * D)));
  } else if (r == WriteRule::PerChannel) {
    a.gate = kernels::Gate::PerChannel;
    g.assign(size_t(tp.T * tp.H * tp.D), 0.0f);
    for (int64_t t = 0; t < tp.T; ++t)
      for (int64_t h = 0; tp.writes[size_t(t)] && h < tp.H; ++h)
        for (int64_t c = 0; c < tp.D; ++c)
          g[size_t((t * tp.H + h) * tp.D + c)] = float(-1 / ((c < tp.D / 2 ? d.fast_lifetime : d.slow_lifetime) * D));
  }
  a.log_decay = g.empty() ? nullptr : g.data();
  std::vector<float> state(size_t(tp.H * tp.D * tp.D), 0.0f), out(size_t(tp.T * tp.H * tp.D));
  a.state = state.data(), a.out = out.data();
  kernels::delta_rule_recurrent(a);
  return out;
}

struct Score {
  double accuracy = 0, cosine = 0, recent_accuracy = 0, recent_cosine = 0;
};

// Reads r_i (rows first_read + i of out, for i < N) against the head's stored values [N, D]; the
// recent_ scores over i >= N - recent.
Score score_head(const std::vector<float>& out, const Tape& tp, int64_t first_read, int64_t h,
                 const std::vector<float>& values, int64_t N, int64_t recent) {
  const int64_t D = tp.D;
  std::vector<float> vnorm(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) vnorm[size_t(j)] = std::sqrt(dot8(&values[size_t(j * D)], &values[size_t(j * D)], D));
  std::vector<uint8_t> hit(static_cast<size_t>(N));
  std::vector<double> own_cos(static_cast<size_t>(N));
  parallel_for(
      N,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const float* r = &out[size_t(((first_read + i) * tp.H + h) * D)];
          int64_t best = 0;
          float best_cos = -2;
          for (int64_t j = 0; j < N; ++j) {  // |r| is common to every candidate
            const float c = dot8(r, &values[size_t(j * D)], D) / vnorm[size_t(j)];
            if (c > best_cos) best_cos = c, best = j;
          }
          hit[size_t(i)] = best == i;
          own_cos[size_t(i)] = cosine(r, &values[size_t(i * D)], D);
        }
      },
      grain_for(N * D));
  Score s;
  for (int64_t i = 0; i < N; ++i) {
    s.accuracy += hit[size_t(i)], s.cosine += own_cos[size_t(i)];
    if (i >= N - recent) s.recent_accuracy += hit[size_t(i)], s.recent_cosine += own_cos[size_t(i)];
  }
  return {s.accuracy / double(N), s.cosine / double(N), s.recent_accuracy / double(recent),
          s.recent_cosine / double(recent)};
}

// All rules for one (D, N): results[rule].
std::vector<CapacityResult> capacity_cell(const MemoryStudyConfig& c, int64_t D, double ratio) {
  const int64_t N = std::llround(ratio * double(D)), H = c.trials, recent = std::min(N, std::max<int64_t>(1, D / 4));
  Tape tp(2 * N, H, D);
  std::vector<std::vector<float>> values(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    Associations as = random_associations(capacity_seed(c.seed, D, N, int(h)), N, D);
    for (int64_t i = 0; i < N; ++i) {
      tp.writes[size_t(i)] = 1;
      std::copy_n(&as.keys[size_t(i * D)], D, tp.at(tp.k, i, h));
      std::copy_n(&as.values[size_t(i * D)], D, tp.at(tp.v, i, h));
      std::copy_n(&as.keys[size_t(i * D)], D, tp.at(tp.q, N + i, h));
    }
    values[size_t(h)] = std::move(as.values);
  }
  std::vector<CapacityResult> r;
  for (WriteRule rule : kWriteRules) {
    const std::vector<float> out = play(tp, rule, c.decay);
    CapacityResult cell{rule, D, N, recent, ratio};
    for (int64_t h = 0; h < H; ++h) {
      const Score s = score_head(out, tp, N, h, values[size_t(h)], N, recent);
      cell.accuracy += s.accuracy / double(H), cell.cosine += s.cosine / double(H);
      cell.recent_accuracy += s.recent_accuracy / double(H), cell.recent_cosine += s.recent_cosine / double(H);
    }
    r.push_back(cell);
  }
  return r;
}

// (k, v1), M other pairs, (k, v2), read k; every rule.
std::vector<RepeatedKeyResult> repeated_cell(const MemoryStudyConfig& c, int64_t D, int64_t M) {
  const int64_t H = c.trials, T = M + 3;
  Tape tp(T, H, D);
  std::vector<float> v1(static_cast<size_t>(H * D)), v2(size_t(H * D));
  for (int64_t h = 0; h < H; ++h) {
    Rng rng(stream_seed("repeated", c.seed, D, M, h));
    random_unit(rng, tp.at(tp.k, 0, h), D, 0, D);
    random_unit(rng, &v1[size_t(h * D)], D, 0, D);
    random_unit(rng, &v2[size_t(h * D)], D, 0, D);
    for (int64_t t = 1; t <= M; ++t) random_unit(rng, tp.at(tp.k, t, h), D, 0, D), random_unit(rng, tp.at(tp.v, t, h), D, 0, D);
    std::copy_n(tp.at(tp.k, 0, h), D, tp.at(tp.k, M + 1, h));
    std::copy_n(tp.at(tp.k, 0, h), D, tp.at(tp.q, M + 2, h));
    std::copy_n(&v1[size_t(h * D)], D, tp.at(tp.v, 0, h));
    std::copy_n(&v2[size_t(h * D)], D, tp.at(tp.v, M + 1, h));
  }
  std::fill(tp.writes.begin(), tp.writes.end() - 1, uint8_t(1));
  std::vector<RepeatedKeyResult> r;
  for (WriteRule rule : kWriteRules) {
    const std::vector<float> out = play(tp, rule, c.decay);
    RepeatedKeyResult cell{rule, D, M, 0, 0};
    for (int64_t h = 0; h < H; ++h) {
      const float* read = &out[size_t(((T - 1) * H + h) * D)];
      cell.cos_new += cosine(read, &v2[size_t(h * D)], D) / double(H);
      cell.cos_old += cosine(read, &v1[size_t(h * D)], D) / double(H);
    }
    r.push_back(cell);
  }
  return r;
}

// The steps at which the forgetting curves are read: about four a doubling, plus the table's columns.
std::vector<int64_t> forgetting_steps(int64_t D, int64_t horizon) {
  std::vector<int64_t> s;
  for (int i = 0;; ++i) {
    const int64_t t = std::llround(std::pow(2.0, i / 4.0));
    if (t > horizon) break;
    s.push_back(t);
  }
  for (int64_t t : {D / 8, D / 2, D, 2 * D, 4 * D, horizon})
    if (t >= 1 && t <= horizon) s.push_back(t);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// One fact, then `horizon` random writes, the fact read at each measured step; every rule, every key
// kind (head = kind · trials + trial; a trial's random writes are the same for the three kinds).
std::vector<ForgettingCurve> forgetting_cell(const MemoryStudyConfig& c, int64_t D) {
  const int64_t trials = c.trials, H = 3 * trials, horizon = std::llround(c.horizon * double(D));
  const std::vector<int64_t> steps = forgetting_steps(D, horizon);
  Tape tp(1 + horizon + int64_t(steps.size()), H, D);
  std::vector<float> fact_v(static_cast<size_t>(H * D));
  std::vector<int64_t> read_rows;
  for (int64_t kind = 0; kind < 3; ++kind)
    for (int64_t trial = 0; trial < trials; ++trial) {
      const int64_t h = kind * trials + trial;
      Rng fact(stream_seed("forgetting-fact", c.seed, D, trial, kind)), noise(stream_seed("forgetting", c.seed, D, trial, 0));
      const FactKey key = kFactKeys[kind];
      random_unit(fact, tp.at(tp.k, 0, h), D, key == FactKey::Slow ? D / 2 : 0, key == FactKey::Fast ? D / 2 : D);
      random_unit(fact, tp.at(tp.v, 0, h), D, 0, D);
      std::copy_n(tp.at(tp.v, 0, h), D, &fact_v[size_t(h * D)]);
      int64_t t = 1;
      size_t next = 0;
      for (int64_t s = 1; s <= horizon; ++s) {
        random_unit(noise, tp.at(tp.k, t, h), D, 0, D), random_unit(noise, tp.at(tp.v, t, h), D, 0, D);
        tp.writes[size_t(t++)] = 1;
        if (next < steps.size() && steps[next] == s) {
          std::copy_n(tp.at(tp.k, 0, h), D, tp.at(tp.q, t, h));
          if (h == 0) read_rows.push_back(t);
          ++t, ++next;
        }
      }
    }
  tp.writes[0] = 1;
  std::vector<ForgettingCurve> r;
  for (WriteRule rule : kWriteRules) {
    const std::vector<float> out = play(tp, rule, c.decay);
    for (int64_t kind = 0; kind < 3; ++kind) {
      ForgettingCurve curve{rule, D, kFactKeys[kind], steps, std::vector<double>(steps.size(), 0.0), -1};
      for (size_t i = 0; i < steps.size(); ++i)
        for (int64_t trial = 0; trial < trials; ++trial) {
          const int64_t h = kind * trials + trial;
          curve.cosine[i] += cosine(&out[size_t((read_rows[i] * H + h) * D)], &fact_v[size_t(h * D)], D) / double(trials);
        }
      for (size_t i = 0; i < steps.size() && curve.steps_to_half < 0; ++i)
        if (curve.cosine[i] < 0.5) curve.steps_to_half = steps[i];
      r.push_back(std::move(curve));
    }
  }
  return r;
}

// Sorts results rule-major (stable: within a rule the order they were computed in).
template <class R>
std::vector<R> rule_major(std::vector<R> v) {
  std::stable_sort(v.begin(), v.end(), [](const R& a, const R& b) { return a.rule < b.rule; });
  return v;
}

}  // namespace

uint64_t capacity_seed(uint64_t seed, int64_t d, int64_t n, int trial) {
  return stream_seed("capacity", seed, d, n, trial);
}

Associations random_associations(uint64_t seed, int64_t n, int64_t d) {
  Rng rng(seed);
  Associations a{std::vector<float>(size_t(n * d)), std::vector<float>(size_t(n * d))};
  for (int64_t i = 0; i < n; ++i) random_unit(rng, &a.keys[size_t(i * d)], d, 0, d);
  for (int64_t i = 0; i < n; ++i) random_unit(rng, &a.values[size_t(i * d)], d, 0, d);
  return a;
}

MemoryStudy run_memory_study(const MemoryStudyConfig& c) {
  LINEAGE_CHECK(c.trials >= 1 && !c.dims.empty() && !c.ratios.empty(), "run_memory_study: trials ", c.trials);
  for (int64_t D : c.dims) {
    LINEAGE_CHECK(D >= 2 && D % 2 == 0, "run_memory_study: D ", D, " must be even and >= 2");
    for (double r : c.ratios) LINEAGE_CHECK(std::llround(r * double(D)) >= 1, "run_memory_study: N/D ", r, " at D ", D);
  }
  const auto t0 = std::chrono::steady_clock::now();
  MemoryStudy s;
  s.config = c;
  for (int64_t D : c.dims) {
    for (double ratio : c.ratios)
      for (const auto& r : capacity_cell(c, D, ratio)) s.capacity.push_back(r);
    for (double b : c.between)
      for (const auto& r : repeated_cell(c, D, std::llround(b * double(D)))) s.repeated.push_back(r);
    for (auto& r : forgetting_cell(c, D)) s.forgetting.push_back(std::move(r));
  }
  s.capacity = rule_major(std::move(s.capacity));
  s.repeated = rule_major(std::move(s.repeated));
  s.forgetting = rule_major(std::move(s.forgetting));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Reports.

namespace {

template <class... A>
std::string fmt(const char* f, A... args) {
  const int n = std::snprintf(nullptr, 0, f, args...);
  std::string out(size_t(std::max(n, 0)), '\0');
  std::snprintf(out.data(), out.size() + 1, f, args...);
  return out;
}

std::string setup_text(const MemoryStudy& s) {
  const MemoryStudyConfig& c = s.config;
  return fmt("Random unit key-value pairs written into one head's state S [D, D] and read back with q = k;\n"
             "writes and reads through kernels::delta_rule_recurrent (beta = 1, scale 1, S = 0 at the start);\n"
             "%d trials (heads) averaged, seed %llu.\n",
             c.trials, (unsigned long long)c.seed) +
         fmt("Decay lifetimes (1 / -log a, in writes; reads never decay): kda's key channels [0, D/2) fast, %.4g D,\n"
             "[D/2, D) slow, %.4g D; gated-delta one scalar with the mean of kda's log-decays, %.4g D.\n",
             c.decay.fast_lifetime, c.decay.slow_lifetime, c.decay.scalar_lifetime());
}

std::string capacity_text(const MemoryStudy& s) {
  std::string o = "\ncapacity: N pairs written, then every key read; accuracy = share of reads whose nearest stored "
                  "value (cosine) is their own, cosine = mean cosine to their own value; newest: the same over the "
                  "newest min(N, D/4) pairs only\n";
  o += fmt("%-12s %-26s %-21s %5s %6s %6s %9s %7s %12s %10s\n", "rule", "write", "forgets", "D", "N/D", "N",
           "accuracy", "cosine", "newest acc", "newest cos");
  for (const CapacityResult& r : s.capacity)
    o += fmt("%-12s %-26s %-21s %5lld %6.3g %6lld %9.3f %7.3f %12.3f %10.3f\n", rule_name(r.rule), rule_write(r.rule),
             rule_forget(r.rule), (long long)r.D, r.ratio, (long long)r.N, r.accuracy, r.cosine, r.recent_accuracy,
             r.recent_cosine);
  return o;
}

std::string repeated_text(const MemoryStudy& s) {
  std::string o = "\nrepeated key: (k, v1), M other pairs, (k, v2), then k read\n";
  o += fmt("%-12s %5s %6s %14s %14s\n", "rule", "D", "M", "cos(read, v2)", "cos(read, v1)");
  for (const RepeatedKeyResult& r : s.repeated)
    o += fmt("%-12s %5lld %6lld %14.3f %14.3f\n", rule_name(r.rule), (long long)r.D, (long long)r.between, r.cos_new,
             r.cos_old);
  return o;
}

std::string forgetting_text(const MemoryStudy& s) {
  std::string o = "\nforgetting: one fact (k, v), then t random pairs (keys over all channels); cosine of the read at "
                  "k to v\n";
  for (int64_t D : s.config.dims) {
    const auto first = std::find_if(s.forgetting.begin(), s.forgetting.end(), [&](const auto& c) { return c.D == D; });
    if (first == s.forgetting.end()) continue;
    const std::vector<int64_t>& steps = first->steps;
    std::vector<size_t> cols;  // indices into steps
    for (int64_t t : {D / 8, D / 2, D, 2 * D, 4 * D}) {
      const size_t i = size_t(std::find(steps.begin(), steps.end(), t) - steps.begin());
      if (i < steps.size() && std::find(cols.begin(), cols.end(), i) == cols.end()) cols.push_back(i);
    }
    o += fmt("%-12s %-14s %5s", "rule", "fact key", "D");
    for (size_t i : cols) o += fmt(" %7s", ("t=" + std::to_string(steps[i])).c_str());
    o += fmt(" %15s\n", "t to cos < 0.5");
    for (const ForgettingCurve& c : s.forgetting) {
      if (c.D != D) continue;
      o += fmt("%-12s %-14s %5lld", rule_name(c.rule), fact_key_name(c.key), (long long)D);
      for (size_t i : cols) o += fmt(" %7.3f", c.cosine[i]);
      o += c.steps_to_half < 0 ? fmt(" %15s\n", (">" + std::to_string(c.steps.back())).c_str())
                               : fmt(" %15lld\n", (long long)c.steps_to_half);
    }
  }
  return o;
}

}  // namespace

std::string memory_study_text(const MemoryStudy& s) {
  return setup_text(s) + capacity_text(s) + repeated_text(s) + forgetting_text(s);
}

nlohmann::json memory_study_json(const MemoryStudy& s) {
  const MemoryStudyConfig& c = s.config;
  nlohmann::json j;
  j["config"] = {{"dims", c.dims}, {"ratios", c.ratios}, {"trials", c.trials}, {"seed", c.seed},
                 {"between", c.between}, {"horizon", c.horizon}};
  j["decay"] = {{"fast_lifetime_d", c.decay.fast_lifetime},
                {"slow_lifetime_d", c.decay.slow_lifetime},
                {"scalar_lifetime_d", c.decay.scalar_lifetime()},
                {"fast_channels", "[0, D/2)"},
                {"slow_channels", "[D/2, D)"}};
  j["capacity"] = nlohmann::json::array();
  for (const auto& r : s.capacity)
    j["capacity"].push_back({{"rule", rule_name(r.rule)}, {"D", r.D}, {"ratio", r.ratio}, {"N", r.N},
                             {"accuracy", r.accuracy}, {"cosine", r.cosine}, {"recent", r.recent},
                             {"recent_accuracy", r.recent_accuracy}, {"recent_cosine", r.recent_cosine}});
  j["repeated_key"] = nlohmann::json::array();
  for (const auto& r : s.repeated)
    j["repeated_key"].push_back({{"rule", rule_name(r.rule)}, {"D", r.D}, {"between", r.between},
                                 {"cos_new", r.cos_new}, {"cos_old", r.cos_old}});
  j["forgetting"] = nlohmann::json::array();
  for (const auto& r : s.forgetting)
    j["forgetting"].push_back({{"rule", rule_name(r.rule)}, {"D", r.D}, {"key", fact_key_name(r.key)},
                               {"steps", r.steps}, {"cosine", r.cosine}, {"steps_to_half", r.steps_to_half}});
  j["seconds"] = s.seconds;
  return j;
}

namespace {

const char* rule_colour(WriteRule r) {
  switch (r) {
    case WriteRule::Additive: return "#1f77b4";
    case WriteRule::Delta: return "#ff7f0e";
    case WriteRule::GatedDelta: return "#2ca02c";
    case WriteRule::PerChannel: return "#d62728";
  }
  return "#000";
}

// One line per rule and D (the first D solid, the others dashed) of a capacity metric vs N/D.
std::string capacity_svg(const MemoryStudy& s, bool newest) {
  std::vector<plot::PlotSeries> series;
  for (size_t di = 0; di < s.config.dims.size(); ++di)
    for (WriteRule rule : kWriteRules) {
      plot::PlotSeries p{cat(rule_name(rule), ", D = ", s.config.dims[di]), {}, di > 0, rule_colour(rule)};
      for (const auto& r : s.capacity)
        if (r.rule == rule && r.D == s.config.dims[di]) p.points.emplace_back(r.ratio, newest ? r.recent_cosine : r.accuracy);
      series.push_back(std::move(p));
    }
  plot::PlotSpec spec{newest ? "Cosine of the newest D/4 reads to their values" : "Retrieval accuracy over all N pairs",
                "N / D (pairs written per key dimension)", newest ? "cosine" : "accuracy", true, 2};
  spec.y_min = 0, spec.y_max = 1.02, spec.id = newest ? "newest" : "capacity";
  return plot::svg_line_plot(spec, series);
}

// The decaying rules with the fact's key in the slow channels (solid) and the fast ones (dashed);
// additive and delta, which do not care where the key lies, with a key over all channels.
std::string forgetting_svg(const MemoryStudy& s, int64_t D) {
  std::vector<plot::PlotSeries> series;
  for (const auto& c : s.forgetting) {
    if (c.D != D) continue;
    const bool decaying = c.rule == WriteRule::GatedDelta || c.rule == WriteRule::PerChannel;
    if (decaying == (c.key == FactKey::Any)) continue;
    plot::PlotSeries p{cat(rule_name(c.rule), ", key in ", fact_key_name(c.key)), {}, c.key == FactKey::Fast,
                 rule_colour(c.rule)};
    for (size_t i = 0; i < c.steps.size(); ++i) p.points.emplace_back(double(c.steps[i]), c.cosine[i]);
    series.push_back(std::move(p));
  }
  plot::PlotSpec spec{cat("Forgetting, D = ", D), "random writes since the fact (t)", "cosine(read, fact's value)", true, 2};
  spec.y_min = -0.2, spec.y_max = 1.02, spec.id = cat("forgetting", D);
  return plot::svg_line_plot(spec, series);
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  f.close();
  if (!f) throw Error(cat("--out: cannot write ", p.string()));
}

std::string html_page(const MemoryStudy& s, const std::string& capacity, const std::string& newest,
                      const std::vector<std::string>& forgetting) {
  std::string o = "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>lineage study memory</title>\n"
                  "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto;padding:0 1em}"
                  "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}</style></head><body>\n"
                  "<h1>lineage study memory</h1>\n<p>" +
                  plot::xml_escape(setup_text(s)) +
                  "</p>\n<p>Additive writes fill a finite store and then corrupt it; the delta rule erases as it "
                  "writes; a decay forgets on purpose; a per-channel decay keeps slow facts while clearing fast "
                  "ones. Each claim is measured below; docs/study.md describes the setup.</p>\n";
  o += "<h2>Capacity</h2>\n" + capacity + newest + "<pre>" + plot::xml_escape(capacity_text(s)) + "</pre>\n";
  o += "<h2>Repeated key</h2>\n<pre>" + plot::xml_escape(repeated_text(s)) + "</pre>\n";
  o += "<h2>Forgetting</h2>\n";
  for (const auto& f : forgetting) o += f;
  o += "<pre>" + plot::xml_escape(forgetting_text(s)) + "</pre>\n";
  return o + fmt("<p>Measured in %.2f s.</p>\n</body></html>\n", s.seconds);
}

}  // namespace

std::vector<std::string> write_memory_study_files(const MemoryStudy& s, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(cat("--out: cannot create the directory ", dir, ": ", ec.message()));
  std::vector<std::string> written;
  const auto put = [&](const std::string& name, const std::string& text) {
    const fs::path p = fs::path(dir) / name;
    write_file(p, text);
    written.push_back(p.string());
  };
  const std::string capacity = capacity_svg(s, false), newest = capacity_svg(s, true);
  put("memory_capacity.svg", capacity);
  put("memory_newest.svg", newest);
  std::vector<std::string> forgetting;
  for (int64_t D : s.config.dims) {
    forgetting.push_back(forgetting_svg(s, D));
    put(cat("memory_forgetting_d", D, ".svg"), forgetting.back());
  }
  put("memory.json", memory_study_json(s).dump(2) + "\n");
  put("memory.html", html_page(s, capacity, newest, forgetting));
  return written;
}

}  // namespace lineage::study
