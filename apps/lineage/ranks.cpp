#include "ranks.h"

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/io/mapping_guard.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/row_split.h"
#include "lineage/layers/ffn/gated_mlp.h"
#include "lineage/layers/ffn/moe.h"
#include "lineage/layers/mixers/mla.h"
#include "lineage/model/model.h"

namespace lineage::app {

namespace {

std::unique_ptr<dist::Transport>& transport() {
  static std::unique_ptr<dist::Transport> t;
  return t;
}

// The split start_ranks installed (an engine installs it again on its own thread).
kernels::RowSplit& installed_split() {
  static kernels::RowSplit s;
  return s;
}

// Matrices below this size are computed whole on every rank (LINEAGE_TP_MIN_BYTES overrides): reading
// 1 MiB takes ~4 µs at a socket's bandwidth, about one gather's latency on a fast fabric.
constexpr size_t kSplitMinBytes = size_t(1) << 20;

// The commands whose work is linear maps on the main thread: they run split across ranks.
constexpr const char* kAcrossRanks[] = {"generate", "logits", "perplexity", "bench", "info", "tokenize", "serve"};

}  // namespace

void start_ranks(const std::string& command) {
  if (!dist::under_mpirun()) {
    transport() = dist::single_rank();
    return;
  }
  // serve stops on SIGINT / SIGTERM taken by a thread of its own (sigwait): the threads MPI starts
  // now must inherit them blocked, or the signal kills the process in one of them.
  if (command == "serve") {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  }
  transport() = dist::mpi_transport();
  dist::Transport& t = *transport();
  if (t.size() <= 1) return;
  bool allowed = false;
  std::string names;
  for (const char* name : kAcrossRanks) {
    allowed = allowed || command == name;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  if (!allowed)
    throw Error(cat("\"", command, "\" runs on one rank; under mpirun with ", t.size(), " ranks these run: ", names));
  if (t.rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    throw Error(cat("rank ", t.rank(), ": cannot send its standard output to /dev/null"));
  dist::Transport* tp = &t;
  installed_split() = {t.rank(), t.size(), split_min_bytes(),
                       [tp](const float* mine, std::span<const int64_t> counts, float* out) {
                         tp->all_gather(mine, counts, out);
                       }};
  kernels::set_row_split(installed_split());
}

int failed(const char* what) {
  const dist::Transport& t = ranks();
  if (t.size() > 1) std::fprintf(stderr, "lineage: error (rank %d of %d): %s\n", t.rank(), t.size(), what);
  else std::fprintf(stderr, "lineage: error: %s\n", what);
  fail_ranks(2);
  return 2;
}

void state_files_on_one_rank(const std::string& option, const std::string& file) {
  if (file.empty() || ranks().size() <= 1) return;
  throw Error(cat(option, " ", file, ": state files are read and written by one process; under mpirun with ",
                  ranks().size(), " ranks each rank holds only its heads' recurrent states"));
}

void set_parallel(const std::string& mode) {
  if (mode != "tensor" && mode != "expert") throw Error(cat("--parallel: expected tensor or expert, found \"", mode, "\""));
  if (ranks().size() <= 1) return;
  installed_split().experts_by_rank = mode == "expert";
  kernels::set_row_split(installed_split());
}

size_t release_unowned(model::Model& m) {
  if (ranks().size() <= 1) return 0;
  const kernels::RowSplit& s = installed_split();
  size_t released = 0;
  // Rows [o0, o1) of t kept, the whole pages before and after them released (t from a mapping).
  const auto keep_rows = [&](const Tensor& t, int64_t o0, int64_t o1) {
    if (!t.defined() || !t.is_borrowed() || t.dim(0) <= 0 || t.nbytes() % size_t(t.dim(0))) return;
    const size_t row = t.nbytes() / size_t(t.dim(0));
    const char* p = static_cast<const char*>(t.raw());
    released += io::unmap_pages(p, size_t(o0) * row);
    released += io::unmap_pages(p + size_t(o1) * row, t.nbytes() - size_t(o1) * row);
  };
  const auto keep = [&](const kernels::Matrix& w, int64_t o0, int64_t o1) {
    for (const Tensor* t : {&w.data, &w.scales, &w.zero_point})
      if (t->defined() && t->dim(0) == w.out) keep_rows(*t, o0, o1);
  };
  // A matrix linear() splits by rows (kernels::splits): this rank's rows.
  const auto rows = [&](const kernels::Matrix& w) {
    if (w.streamed || !w.data.defined() || !kernels::splits(s, w.view(false))) return;
    const auto [o0, o1] = kernels::rank_rows(w.out, s.rank, s.ranks);
    keep(w, o0, o1);
  };
  for (model::Block& b : m.blocks) {
    std::visit([&](auto& mixer) {
      const kernels::Matrix* whole = nullptr;
      if constexpr (std::is_same_v<std::decay_t<decltype(mixer)>, layers::Mla>) whole = &mixer.weights.kv_b_proj;
      mixer.for_each_matrix([&](kernels::Matrix& w) {
        if (&w != whole) rows(w);
      });
    }, b.mixer);
    auto* moe = std::get_if<layers::Moe>(&b.ffn);
    if (!moe) {
      std::visit([&](auto& ffn) { ffn.for_each_matrix(rows); }, b.ffn);
      continue;
    }
    // The routed experts as forward() runs them (layers::routed_split_mode): each rank's rows of every
    // expert, its own experts whole, or every expert whole on every rank.
    std::set<const kernels::Matrix*> routed;
    const layers::RoutedSplit mode = layers::routed_split_mode(*moe, &s);
    const int64_t E = int64_t(moe->weights.experts.size());
    const auto [e0, e1] = kernels::rank_rows(E, s.rank, s.ranks);
    for (int64_t e = 0; e < E; ++e) {
      const layers::GatedMlp::Weights& w = moe->weights.experts[size_t(e)].weights;
      for (const kernels::Matrix* x : {&w.gate_proj, &w.up_proj, &w.down_proj}) {
        routed.insert(x);
        if (mode == layers::RoutedSplit::Rows) rows(*x);
        if (mode == layers::RoutedSplit::ByRank && (e < e0 || e >= e1)) keep(*x, 0, 0);
      }
    }
    moe->for_each_matrix([&](kernels::Matrix& w) {
      if (!routed.count(&w)) rows(w);
    });
  }
  if (!m.config.tied_lm_head) {
    if (const kernels::Matrix* blocks = m.output_blocks()) {
      rows(*blocks);
    } else if (kernels::splits(s, {&m.lm_head, kernels::Layout::OutIn, false})) {
      const auto [o0, o1] = kernels::rank_rows(m.lm_head.dim(0), s.rank, s.ranks);
      keep_rows(m.lm_head, o0, o1);
    }
  }
  return released;
}

runtime::EngineRanks engine_ranks() {
  dist::Transport& t = ranks();
  runtime::EngineRanks r{.rank = t.rank(), .ranks = t.size(), .broadcast = {}, .on_thread = {}, .fail = {}};
  if (t.size() <= 1) return r;
  dist::Transport* tp = &t;
  r.broadcast = [tp](std::string& message) {
    // Its length first, in the broadcast the other ranks may wait long for; then the bytes.
    uint64_t n = message.size();
    tp->broadcast_waiting(&n, sizeof n, 0);
    message.resize(size_t(n));
    if (n > 0) tp->broadcast(message.data(), message.size(), 0);
  };
  r.on_thread = [] { kernels::set_row_split(installed_split()); };
  r.fail = [](const std::string& message) { failed(message.c_str()); };
  return r;
}

size_t split_min_bytes() {
  const char* v = std::getenv("LINEAGE_TP_MIN_BYTES");
  return v && *v ? parse_bytes(v, "LINEAGE_TP_MIN_BYTES") : kSplitMinBytes;
}

dist::Transport& ranks() {
  if (!transport()) transport() = dist::single_rank();
  return *transport();
}

bool is_root() { return ranks().rank() == 0; }

void fail_ranks(int code) {
  if (transport() && transport()->size() > 1) {
    kernels::clear_row_split();
    std::fflush(stderr);
    transport()->abort(code);
  }
}

void end_ranks() {
  if (transport() && transport()->size() > 1 && transport()->rank() == 0) {
    const kernels::RowSplitStats st = kernels::row_split_stats();
    std::fprintf(stderr, "lineage: %d ranks over %s: %lld row gathers (%lld of experts placed by rank), rank 0 sent %.3g MB and received %.3g MB in %.3f s\n",
                 transport()->size(), transport()->name().c_str(), static_cast<long long>(st.gathers),
                 static_cast<long long>(st.expert_gathers),
                 double(st.floats_sent) * 4e-6, double(st.floats_received) * 4e-6, st.seconds);
  }
  kernels::clear_row_split();
  transport().reset();
}

}  // namespace lineage::app
