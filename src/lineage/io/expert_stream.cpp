#include "lineage/io/expert_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <tuple>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <variant>

#if LINEAGE_HAVE_URING
#include <liburing.h>
#endif

#include "lineage/core/error.h"
#include "lineage/io/mapping_guard.h"
#include "lineage/io/stream_files.h"
#include "lineage/io/trunk_stream.h"
#include "lineage/kernels/matrix.h"
#include "lineage/layers/ffn/moe.h"

namespace lineage::io {

namespace {

// inject_read_fault's state: reads until the fault (0: none) and the errno it gives (0: a short read).
std::atomic<int64_t> g_fault_countdown{0};
std::atomic<int> g_fault_err{0};

constexpr uint64_t kPage = 4096;           // O_DIRECT's alignment, and the mapping's
constexpr uint64_t kHuge = 2 << 20;        // a transparent huge page
constexpr uint64_t kJoinGap = 64 << 10;    // an expert's ranges closer than this are read as one
constexpr unsigned kRingDepth = 64;

uint64_t page_down(uint64_t x) { return x / kPage * kPage; }
uint64_t page_up(uint64_t x) { return (x + kPage - 1) / kPage * kPage; }

// The tensors of a GatedMlp an expert reads: matrix 0..2 (gate, up, down) × its stored members.
kernels::Matrix& matrix_of(layers::GatedMlp& g, int i) {
  return i == 0 ? g.weights.gate_proj : i == 1 ? g.weights.up_proj : g.weights.down_proj;
}
Tensor& member_of(kernels::Matrix& w, int f) {
  switch (f) {
    case 0: return w.data;
    case 1: return w.scales;
    case 2: return w.zero_point;
    case 3: return w.global_scale;
    default: return w.weight_shape;
  }
}
constexpr int kMembers = 5;
const char* kMatrixNames[] = {"gate", "up", "down"};

struct OpenFile {
  std::string path;
  int fd = -1;
  bool direct = false;
  struct stat at_load {};
};

struct Range {
  int file = 0;
  uint64_t begin = 0, end = 0;  // whole pages of the file
  uint64_t need = 0;            // the bytes that must be there (the last tensor's end), from begin
  uint64_t at = 0;              // where it lands in the expert's buffer
};
struct Member {
  int matrix = 0, field = 0;
  uint64_t at = 0;  // in the expert's buffer
};
struct ExpertRec {
  layers::GatedMlp tmpl;  // shapes, formats; its tensors views of the mapping (never read)
  std::vector<Range> ranges;
  std::vector<Member> members;
  uint64_t bytes = 0;
};
struct LayerRec {
  std::vector<ExpertRec> experts;
  int partition = 0;
};

struct Entry {
  int layer = 0;
  int32_t expert = 0;
  uint64_t bytes = 0;
  std::shared_ptr<uint8_t> buf;
  layers::GatedMlp mlp;
  int pending = 0;       // reads in flight
  bool issued = false, ready = false, pinned = false;
  int partition = 0;
  std::list<Entry*>::iterator lru;
};

}  // namespace

class ExpertStore {
 public:
  ExpertStore(std::vector<OpenFile> files, std::vector<LayerRec> layers, std::vector<uint64_t> capacity, bool uring)
      : files_(std::move(files)), layers_(std::move(layers)), capacity_(std::move(capacity)) {
    used_.assign(capacity_.size(), 0);
    lru_.resize(capacity_.size());
    spare_.resize(capacity_.size());
#if LINEAGE_HAVE_URING
    if (uring && io_uring_queue_init(kRingDepth, &ring_, 0) == 0) uring_ = true;
#else
    (void)uring;
#endif
    bool direct = false, buffered = false;
    for (const OpenFile& f : files_) (f.direct ? direct : buffered) = true;
    stats_.io = cat(uring_ ? "io_uring" : "pread", ", ", direct && buffered ? "O_DIRECT and buffered" : direct ? "O_DIRECT" : "buffered");
  }
  ~ExpertStore() {
#if LINEAGE_HAVE_URING
    if (uring_) {
      try {
        drain();
      } catch (const Error&) {  // the ring itself failed: nothing more can be waited for
      }
      io_uring_queue_exit(&ring_);
    }
#endif
    for (OpenFile& f : files_)
      if (f.fd >= 0) ::close(f.fd);
  }
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  void request(int layer, const int32_t* ids, int64_t n) {
    check_files();
    for (size_t j = 0; j < want_.size(); ++j) unpin(j);
    // What an earlier step left half read (it failed before running all its experts: a read that
    // failed, one never submitted after it, an error in between): its reads still in flight are
    // waited for, and every expert not ready is forgotten and read again when asked for. A step that
    // ran them all left none, and nothing is scanned.
    const bool failed = ran_ < want_.size();
    want_.clear();
    ran_ = 0;
    if (failed) drain();
    for (auto it = entries_.begin(); failed && it != entries_.end();) {
      if (it->second->ready) {
        ++it;
        continue;
      }
      it->second->pending = 0;
      drop(*it->second);
      it = entries_.erase(it);
    }
    for (int64_t i = 0; i < n; ++i) {
      LINEAGE_CHECK(ids[i] >= 0 && size_t(ids[i]) < layers_[size_t(layer)].experts.size(), "expert id out of range");
      ++stats_.requests;
      want_.push_back(key(layer, ids[i]));
      Entry& e = wanted(want_.size() - 1);
      if (e.issued) {  // resident (or on its way): most recently used now
        auto& l = lru_[size_t(e.partition)];
        l.splice(l.end(), l, e.lru);
      }
    }
    issue(0, false);
  }

  const layers::GatedMlp& expert(int64_t i) {
    if (i > 0) unpin(size_t(i - 1));  // run (the ones before it were unpinned in their turn): evictable now
    Entry& e = wanted(size_t(i));
    if (!e.issued) issue(size_t(i), true);
    if (!e.issued)
      throw Error(cat("expert cache: no room for layer ", e.layer, "'s expert ", e.expert, " (", e.bytes,
                      " bytes) in a cache of ", capacity_[size_t(e.partition)], " bytes"));
    const auto t0 = std::chrono::steady_clock::now();
    while (e.pending) reap(true);
    stats_.read_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!e.ready) finish(e);
    ran_ = size_t(i) + 1;
    return e.mlp;
  }

  void set_int8_dot(bool on) {
    int8_dot_ = on;
    for (auto& [k, e] : entries_)
      if (e->ready)
        for (int i = 0; i < 3; ++i)
          if (kernels::Matrix& w = matrix_of(e->mlp, i); w.quant.defined()) w.qw.int8_dot = on;
  }

  StreamStats stats() const {
    StreamStats s = stats_;
    s.hits = s.requests - std::min(s.requests, s.misses);  // resident when the step asked, not read for it
    return s;
  }
  void reset_stats() {
    const std::string io = stats_.io;
    stats_ = StreamStats{};
    stats_.io = io;
  }
  DiskRoofline measure_disk(uint64_t max_bytes) {
    DiskRoofline d;
    d.how = stats_.io;
    std::vector<int> fds;
    for (const OpenFile& f : files_) fds.push_back(f.fd);
    const SequentialRead seq = read_sequentially(fds, max_bytes);
    d.sequential_bytes = seq.bytes, d.sequential = seq.rate;
    // Random whole experts, read together: a step's misses.
    std::vector<std::pair<int, int32_t>> all;
    for (size_t l = 0; l < layers_.size(); ++l)
      for (size_t e = 0; e < layers_[l].experts.size(); ++e) all.emplace_back(int(l), int32_t(e));
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    std::vector<std::pair<int, int32_t>> pick;
    for (size_t i = 0; i < 64 && !all.empty(); ++i) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const size_t j = size_t(seed >> 33) % all.size();
      pick.push_back(all[j]);
      all.erase(all.begin() + std::ptrdiff_t(j));
    }
    clear();
    std::vector<Entry> probes(pick.size());
    std::vector<Read> batch;
    for (size_t i = 0; i < pick.size(); ++i) {
      Entry& e = probes[i];
      e.layer = pick[i].first, e.expert = pick[i].second;
      e.bytes = layers_[size_t(e.layer)].experts[size_t(e.expert)].bytes;
      void* b = std::aligned_alloc(kPage, page_up(e.bytes));
      if (!b) throw Error("disk roofline: out of memory");
      e.buf = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(b), [](uint8_t* q) { std::free(q); });
      for (const Range& r : layers_[size_t(e.layer)].experts[size_t(e.expert)].ranges) {
        batch.push_back({&e, &r});
        ++e.pending;
      }
    }
    std::sort(batch.begin(), batch.end(), [](const Read& a, const Read& b) {
      return std::tie(a.r->file, a.r->begin) < std::tie(b.r->file, b.r->begin);
    });
    const StreamStats keep = stats_;
    const auto t0 = std::chrono::steady_clock::now();
    for (const Read& rd : batch) submit(rd);
#if LINEAGE_HAVE_URING
    if (uring_ && !batch.empty()) io_uring_submit(&ring_);
#endif
    for (const Entry& e : probes)
      while (e.pending) reap(true);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    d.random_bytes = stats_.bytes_read - keep.bytes_read;
    d.random_reads = int64_t(batch.size());
    d.random = s > 0 ? double(d.random_bytes) / s : 0;
    stats_ = keep;
    return d;
  }

  void clear() {
    drain();
    want_.clear();
    ran_ = 0;
    for (auto& [k, e] : entries_) drop(*e);
    entries_.clear();
  }

 private:
  static uint64_t key(int layer, int32_t expert) { return (uint64_t(uint32_t(layer)) << 32) | uint32_t(expert); }
  // The step's j-th expert, pinned; a new entry (not read yet) where it is not cached.
  Entry& wanted(size_t j) {
    const uint64_t k = want_[j];
    auto it = entries_.find(k);
    if (it == entries_.end()) {
      auto e = std::make_unique<Entry>();
      e->layer = int(k >> 32), e->expert = int32_t(uint32_t(k));
      e->bytes = layers_[size_t(e->layer)].experts[size_t(e->expert)].bytes;
      e->partition = layers_[size_t(e->layer)].partition;
      it = entries_.emplace(k, std::move(e)).first;
    }
    it->second->pinned = true;
    return *it->second;
  }
  void unpin(size_t j) {
    const auto it = entries_.find(want_[j]);
    if (it != entries_.end()) it->second->pinned = false;
  }

  // An expert's file has changed since the load: an Error naming it.
  void check_files() const {
    for (const OpenFile& f : files_) check_unchanged(f.path, f.fd, f.at_load, "experts");
  }

  // Out of the cache (an issued entry is in its partition's LRU list). Its buffer stays as the
  // partition's spare of its size (one a size; the cache's bytes still count it), else is freed.
  void drop(Entry& e) {
    if (!e.issued) return;
    lru_[size_t(e.partition)].erase(e.lru);
    e.issued = false;
    e.mlp = layers::GatedMlp{};  // its views of the buffer
    auto& spare = spare_[size_t(e.partition)][e.bytes];
    if (e.buf && e.buf.use_count() == 1 && spare == nullptr) {
      spare = std::move(e.buf);
      return;
    }
    e.buf.reset();
    used_[size_t(e.partition)] -= e.bytes;
  }

  std::shared_ptr<uint8_t> take_spare(int p, uint64_t bytes) {
    const auto it = spare_[size_t(p)].find(bytes);
    return it == spare_[size_t(p)].end() ? nullptr : std::exchange(it->second, nullptr);
  }
  bool has_spare(int p, uint64_t bytes) const {
    const auto it = spare_[size_t(p)].find(bytes);
    return it != spare_[size_t(p)].end() && it->second != nullptr;
  }
  // Spares of other sizes than `bytes` freed; whether that made room.
  bool free_spares(int p, uint64_t bytes) {
    for (auto& [size, buf] : spare_[size_t(p)])
      if (buf && size != bytes) buf.reset(), used_[size_t(p)] -= size;
    return used_[size_t(p)] + bytes <= capacity_[size_t(p)];
  }

  // A read buffer: from 2 MiB on, whole 2 MiB pages advised for transparent huge pages. A fresh 4 KiB
  // page's first touch costs ~10 µs here, which O_DIRECT pays as the kernel pins the pages: a 3.8 MB
  // Kimi Linear expert read into new 4 KiB pages ran at 0.7 GB/s, into reused ones at 3 GB/s.
  static std::shared_ptr<uint8_t> allocate(uint64_t bytes) {
    const size_t align = bytes >= kHuge ? kHuge : kPage;
    void* p = nullptr;
    if (posix_memalign(&p, align, size_t(page_up(bytes))) != 0) return nullptr;
    if (align > kPage) ::madvise(p, size_t(page_up(bytes)), MADV_HUGEPAGE);
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  }

  // Room for `bytes` in partition p: least recently used unpinned experts evicted. False when the
  // pinned ones leave too little.
  bool make_room(int p, uint64_t bytes) {
    if (used_[size_t(p)] + bytes <= capacity_[size_t(p)] || free_spares(p, bytes)) return true;
    auto& l = lru_[size_t(p)];
    for (auto it = l.begin(); used_[size_t(p)] + bytes > capacity_[size_t(p)] && !has_spare(p, bytes) && it != l.end();) {
      Entry* e = *it;
      if (e->pinned || e->pending) {
        ++it;
        continue;
      }
      ++it;
      ++stats_.evictions;
      drop(*e);
      entries_.erase(key(e->layer, e->expert));
      free_spares(p, bytes);
    }
    return used_[size_t(p)] + bytes <= capacity_[size_t(p)] || has_spare(p, bytes);
  }

  // Room for `bytes` in partition p from the experts this step runs after its i-th, last first.
  bool evict_later(size_t i, int p, uint64_t bytes) {
    for (size_t j = want_.size(); j-- > i + 1 && used_[size_t(p)] + bytes > capacity_[size_t(p)] && !has_spare(p, bytes);) {
      const auto it = entries_.find(want_[j]);
      if (it == entries_.end() || it->second->partition != p || it->second->pending || !it->second->issued) continue;
      ++stats_.evictions;
      drop(*it->second);
      entries_.erase(it);
      free_spares(p, bytes);
    }
    return used_[size_t(p)] + bytes <= capacity_[size_t(p)] || has_spare(p, bytes);
  }

  struct Read {
    Entry* e;
    const Range* r;
  };

  // Reads issued for the wanted experts from `from` on that are not yet, as far as the cache has room,
  // all at once in file-offset order.
  void issue(size_t from, bool now) {
    std::vector<Read> batch;
    for (size_t i = from; i < want_.size(); ++i) {
      Entry& e = wanted(i);
      if (e.issued) continue;
      // No room: the rest when the ones before them have run; the one that must run now may evict
      // experts this step runs later (they are read again in their turn).
      // A buffer of an evicted expert of the same size is reused (its pages already faulted in).
      e.buf = take_spare(e.partition, e.bytes);
      if (!e.buf) {
        if (!make_room(e.partition, e.bytes) && !(now && i == from && evict_later(i, e.partition, e.bytes))) break;
        e.buf = take_spare(e.partition, e.bytes);
      }
      if (!e.buf) {
        e.buf = allocate(e.bytes);
        if (!e.buf) throw Error(cat("expert cache: out of memory reading layer ", e.layer, "'s expert ", e.expert));
        used_[size_t(e.partition)] += e.bytes;
      }
      ++stats_.misses;
      e.issued = true;
      stats_.peak_cache_bytes = std::max(stats_.peak_cache_bytes, total_used());
      auto& l = lru_[size_t(e.partition)];
      e.lru = l.insert(l.end(), &e);
      for (const Range& r : layers_[size_t(e.layer)].experts[size_t(e.expert)].ranges) {
        batch.push_back({&e, &r});
        ++e.pending;
      }
    }
    std::sort(batch.begin(), batch.end(), [](const Read& a, const Read& b) {
      return std::tie(a.r->file, a.r->begin) < std::tie(b.r->file, b.r->begin);
    });
    const auto t0 = std::chrono::steady_clock::now();
    for (const Read& rd : batch) submit(rd);
#if LINEAGE_HAVE_URING
    if (uring_ && !batch.empty()) io_uring_submit(&ring_);
#endif
    stats_.read_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  uint64_t total_used() const {
    uint64_t s = 0;
    for (uint64_t u : used_) s += u;
    return s;
  }

  void submit(const Read& rd) {
    ++stats_.reads;
    const Range& r = *rd.r;
    uint8_t* dst = rd.e->buf.get() + r.at;
#if LINEAGE_HAVE_URING
    if (uring_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      while (!sqe) {  // the ring is full: hand it what it holds, take one completion
        io_uring_submit(&ring_);
        reap(true);
        sqe = io_uring_get_sqe(&ring_);
      }
      io_uring_prep_read(sqe, files_[size_t(r.file)].fd, dst, unsigned(r.end - r.begin), r.begin);
      auto* tag = new Read(rd);
      io_uring_sqe_set_data(sqe, tag);
      ++in_flight_;
      return;
    }
#endif
    // The pread loop: read now, to the end of the range or of the file.
    uint64_t got = 0;
    while (got < r.end - r.begin) {
      const ssize_t n = ::pread(files_[size_t(r.file)].fd, dst + got, size_t(r.end - r.begin - got), off_t(r.begin + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_read(r, -errno);
      if (n == 0) break;
      got += uint64_t(n);
    }
    completed(rd, int64_t(got));
  }

  [[noreturn]] void fail_read(const Range& r, int err) const {
    throw Error(cat(files_[size_t(r.file)].path, ": reading experts at byte ", r.begin, " (", r.end - r.begin,
                    " bytes) failed: ", std::strerror(-err)));
  }

  void completed(const Read& rd, int64_t res) {
    const Range& r = *rd.r;
    if (g_fault_countdown.load() > 0 && g_fault_countdown.fetch_sub(1) == 1) {
      const int err = g_fault_err.load();
      res = err > 0 ? -int64_t(err) : int64_t(r.need) - 1;
    }
    if (res < 0) fail_read(r, int(res));
    if (uint64_t(res) < r.need)
      throw Error(cat(files_[size_t(r.file)].path, ": a short read of experts at byte ", r.begin, ": ", res, " of ", r.need,
                      " bytes; the file is shorter than at load (it shrank, or was rewritten)"));
    stats_.bytes_read += uint64_t(res);
    --rd.e->pending;
  }

  // One completion taken (waiting for it when `wait`).
  void reap(bool wait) {
#if LINEAGE_HAVE_URING
    if (!uring_ || !in_flight_) return;
    io_uring_cqe* cqe = nullptr;
    const int rc = wait ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
    if (rc == -EINTR || rc == -EAGAIN || !cqe) return;
    if (rc < 0) throw Error(cat("expert reads: io_uring: ", std::strerror(-rc)));
    std::unique_ptr<Read> tag(static_cast<Read*>(io_uring_cqe_get_data(cqe)));
    const int64_t res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
    completed(*tag, res);
#else
    (void)wait;
#endif
  }

  // Every read in flight completed (their results dropped): before the buffers go.
  void drain() {
#if LINEAGE_HAVE_URING
    while (uring_ && in_flight_) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR || rc == -EAGAIN || (rc == 0 && !cqe)) continue;
      if (rc < 0) throw Error(cat("expert reads: io_uring: waiting for the reads in flight: ", std::strerror(-rc)));
      std::unique_ptr<Read> tag(static_cast<Read*>(io_uring_cqe_get_data(cqe)));
      if (tag->e->pending) --tag->e->pending;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
#endif
  }

  // The expert's GatedMlp over its buffer: each stored tensor a view at its place, quantized matrices
  // prepared again (their codes and tables from the buffer).
  void finish(Entry& e) {
    const ExpertRec& rec = layers_[size_t(e.layer)].experts[size_t(e.expert)];
    e.mlp = rec.tmpl;
    for (const Member& m : rec.members) {
      Tensor& t = member_of(matrix_of(e.mlp, m.matrix), m.field);
      t = Tensor::borrow(t.dtype(), t.shape(), e.buf.get() + m.at, std::shared_ptr<const void>(e.buf, e.buf.get()));
    }
    for (int i = 0; i < 3; ++i) {
      kernels::Matrix& w = matrix_of(e.mlp, i);
      // The load's checks, as each expert is read: an MXFP4 scale of 255 (NaN), a quantized format's
      // scales (prepare_quant).
      if (const int64_t at = w.packed && !w.quant.defined() ? kernels::first_nan_scale(w.scales) : -1; at >= 0)
        throw Error(cat("layer ", e.layer, "'s expert ", e.expert, " (", kMatrixNames[i], "): the MXFP4 block scale ", at,
                        " is 255, which E8M0 reserves for NaN; the checkpoint is damaged"));
      if (!w.quant.defined()) continue;
      kernels::prepare_quant(w, cat("layer ", e.layer, " expert ", e.expert, " ", kMatrixNames[i]));
      w.qw.int8_dot = int8_dot_;  // as model::set_int8_dot sets the resident matrices
    }
    e.ready = true;
  }

  std::vector<OpenFile> files_;
  std::vector<LayerRec> layers_;
  std::vector<uint64_t> capacity_, used_;
  std::vector<std::list<Entry*>> lru_;
  std::vector<std::map<uint64_t, std::shared_ptr<uint8_t>>> spare_;  // per partition, by size
  std::unordered_map<uint64_t, std::unique_ptr<Entry>> entries_;
  std::vector<uint64_t> want_;  // the step's experts (keys), in the order they run
  size_t ran_ = 0;              // how many of them expert() has handed out
  StreamStats stats_;
  bool uring_ = false;
  int64_t in_flight_ = 0;
  bool int8_dot_ = false;
#if LINEAGE_HAVE_URING
  io_uring ring_{};
#endif
};

namespace {

class LayerSource : public layers::ExpertSource {
 public:
  LayerSource(std::shared_ptr<ExpertStore> store, int layer) : store_(std::move(store)), layer_(layer) {}
  void request(const int32_t* experts, int64_t n) override { store_->request(layer_, experts, n); }
  const layers::GatedMlp& expert(int64_t i) override { return store_->expert(i); }

 private:
  std::shared_ptr<ExpertStore> store_;
  int layer_;
};

}  // namespace

void inject_read_fault(int64_t nth, int err) {
  g_fault_err.store(err);
  g_fault_countdown.store(std::max<int64_t>(nth, 0));
}

namespace {

// The plan of a trunk streamed layer by layer (the routed experts, if any, already out of the model),
// and its minimum: an Error naming it when the budget is below.
void plan_streamed_trunk(model::Model& m, const StreamOptions& opt, StreamPlan& plan, uint64_t experts_need,
                         const std::string& experts_label) {
  const uint64_t resident_minimum = plan.minimum_budget;
  plan.trunk = plan_trunk(m);
  plan.trunk_streamed = plan.streaming = true;
  plan.minimum_budget = plan.trunk.fixed_bytes + plan.trunk.window_bytes + experts_need;
  if (opt.budget >= plan.minimum_budget) {
    pin_units(plan.trunk, opt.budget - plan.trunk.fixed_bytes - experts_need);
    return;
  }
  throw Error(cat("--memory-budget ", opt.budget, " bytes is below this model's minimum, ", plan.minimum_budget,
                  " bytes, with its trunk streamed layer by layer: ", plan.trunk.window_bytes, " (",
                  plan.trunk.window_units, ", one running and one read ahead)",
                  plan.trunk.fixed_bytes ? cat(" + ", plan.trunk.fixed_bytes, " held in memory (decoded or copied at load)") : "",
                  experts_need ? cat(" + ", experts_need, experts_label) : "",
                  "; with the trunk resident the minimum is ", resident_minimum, " bytes"));
}

}  // namespace

std::shared_ptr<ExpertStore> stream_experts(model::Model& m, const StreamOptions& opt, StreamPlan& plan) {
  plan = StreamPlan{};
  plan.budget = opt.budget;
  // Every weight's bytes, and each routed expert's stored tensors.
  uint64_t total = 0;
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) total += uint64_t(t.nbytes());
  });
  std::vector<int> moe_layers;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    auto* moe = std::get_if<layers::Moe>(&m.blocks[i].ffn);
    if (!moe) continue;
    moe_layers.push_back(int(i));
    for (auto& e : moe->weights.experts)
      for (int k = 0; k < 3; ++k)
        for (int f = 0; f < kMembers; ++f)
          if (const Tensor& t = member_of(matrix_of(e, k), f); t.defined()) plan.routed_bytes += uint64_t(t.nbytes());
    plan.experts += int64_t(moe->weights.experts.size());
  }
  plan.moe_layers = int64_t(moe_layers.size());
  plan.resident_bytes = total - plan.routed_bytes;
  plan.minimum_budget = total;
  if (opt.budget >= total) return nullptr;
  if (moe_layers.empty()) {
    if (!opt.trunk)
      throw Error(cat("--memory-budget ", opt.budget, " bytes: this model has no routed experts to stream, its weights need ",
                      total, " bytes resident, and its trunk does not stream layer by layer ", opt.no_trunk_stream));
    plan_streamed_trunk(m, opt, plan, 0, "");
    stream_trunk(m, plan.trunk);
    return nullptr;
  }

  // Where each expert's tensors lie: the files, the joined page ranges, each tensor's place in the buffer.
  std::vector<OpenFile> files;
  std::map<std::string, int> file_index;
  std::vector<LayerRec> layers(m.blocks.size());
  plan.routed_bytes = 0;
  for (int li : moe_layers) {
    auto& moe = std::get<layers::Moe>(m.blocks[size_t(li)].ffn);
    LayerRec& lr = layers[size_t(li)];
    for (size_t ei = 0; ei < moe.weights.experts.size(); ++ei) {
      layers::GatedMlp& g = moe.weights.experts[ei];
      struct Piece {
        int file;
        uint64_t offset, bytes;
        int matrix, field;
      };
      std::vector<Piece> pieces;
      for (int k = 0; k < 3; ++k)
        for (int f = 0; f < kMembers; ++f) {
          Tensor& t = member_of(matrix_of(g, k), f);
          if (!t.defined()) continue;
          const std::optional<MappedAt> at = t.is_borrowed() ? find_mapping(t.raw()) : std::nullopt;
          if (!at)
            throw Error(cat("--memory-budget: layer ", li, "'s expert ", ei, " (", kMatrixNames[k],
                            ") is not in a checkpoint file as stored (decoded at load); "
                            "streaming reads experts from the files as they are"));
          auto [it, added] = file_index.emplace(at->path, int(files.size()));
          if (added) {
            OpenFile of;
            of.path = at->path;
            of.fd = opt.direct ? ::open(at->path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC) : -1;
            of.direct = of.fd >= 0;
            if (of.fd < 0) of.fd = ::open(at->path.c_str(), O_RDONLY | O_CLOEXEC);
            if (of.fd < 0) throw Error(cat(at->path, ": cannot open it to read experts: ", std::strerror(errno)));
            ::fstat(of.fd, &of.at_load);
            files.push_back(std::move(of));
          }
          pieces.push_back({it->second, at->offset, uint64_t(t.nbytes()), k, f});
        }
      std::sort(pieces.begin(), pieces.end(),
                [](const Piece& a, const Piece& b) { return std::tie(a.file, a.offset) < std::tie(b.file, b.offset); });
      ExpertRec rec;
      rec.tmpl = g;
      for (const Piece& p : pieces) {
        if (rec.ranges.empty() || rec.ranges.back().file != p.file || p.offset > rec.ranges.back().end + kJoinGap) {
          Range r;
          r.file = p.file, r.begin = page_down(p.offset), r.end = r.begin;
          r.at = rec.bytes;
          rec.ranges.push_back(r);
        }
        Range& r = rec.ranges.back();
        const uint64_t grown = std::max(r.end, page_up(p.offset + p.bytes));
        rec.bytes += grown - r.end;
        r.end = grown;
        r.need = std::max(r.need, p.offset + p.bytes - r.begin);
        rec.members.push_back({p.matrix, p.field, r.at + (p.offset - r.begin)});
      }
      // The template's prepared tables go (the cached copy makes its own); its tensors stay views.
      for (int k = 0; k < 3; ++k) {
        kernels::Matrix& w = matrix_of(rec.tmpl, k);
        w.scale_table = Tensor(), w.zero_table = Tensor();
        kernels::Matrix& orig = matrix_of(g, k);
        orig.scale_table = Tensor(), orig.zero_table = Tensor();
      }
      // A buffer from 2 MiB on is whole 2 MiB pages (allocate()), and the cache counts it so.
      if (rec.bytes >= kHuge) rec.bytes = (rec.bytes + kHuge - 1) / kHuge * kHuge;
      plan.routed_bytes += rec.bytes;
      plan.largest_expert = std::max(plan.largest_expert, rec.bytes);
      lr.experts.push_back(std::move(rec));
    }
  }
  const uint64_t need = opt.policy == CachePolicy::PerLayer ? plan.largest_expert * uint64_t(moe_layers.size()) : plan.largest_expert;
  const char* need_label =
      opt.policy == CachePolicy::PerLayer ? " (the largest expert, once per MoE layer)" : " (the largest expert)";
  plan.minimum_budget = plan.resident_bytes + need;
  const bool trunk_streams = opt.budget < plan.minimum_budget;  // decided once the experts have left the model
  if (trunk_streams && !opt.trunk) {
    for (OpenFile& f : files) ::close(f.fd);
    throw Error(cat("--memory-budget ", opt.budget, " bytes is below this model's minimum, ", plan.minimum_budget, " bytes: ",
                    plan.resident_bytes, " resident (every weight but the routed experts) + ", need, need_label,
                    "; the trunk does not stream layer by layer ", opt.no_trunk_stream));
  }
  plan.streaming = true;
  plan.cache_bytes = opt.budget - std::min(opt.budget, plan.resident_bytes);
  // The mapping's pages of the experts, should anything have touched them, leave this process.
  for (int li : moe_layers)
    for (auto& g : std::get<layers::Moe>(m.blocks[size_t(li)].ffn).weights.experts)
      for (int k = 0; k < 3; ++k)
        for (int f = 0; f < kMembers; ++f)
          if (const Tensor& t = member_of(matrix_of(g, k), f); t.defined()) {
            const uintptr_t b = reinterpret_cast<uintptr_t>(t.raw()), first = (b + kPage - 1) / kPage * kPage,
                            last = (b + uintptr_t(t.nbytes())) / kPage * kPage;
            if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
          }
  // The model keeps the experts' shapes and formats; their tensors now live in the store's templates.
  for (int li : moe_layers)
    for (auto& g : std::get<layers::Moe>(m.blocks[size_t(li)].ffn).weights.experts)
      for (int k = 0; k < 3; ++k) {
        matrix_of(g, k).streamed = true;
        for (int f = 0; f < kMembers; ++f) member_of(matrix_of(g, k), f) = Tensor();
      }
  // A trunk that does not fit with the largest expert streams layer by layer; the cache gets what the
  // budget leaves past its window.
  if (trunk_streams) {
    try {
      plan_streamed_trunk(m, opt, plan, need, need_label);
    } catch (const Error&) {
      for (OpenFile& f : files) ::close(f.fd);
      throw;
    }
    plan.cache_bytes = opt.budget - plan.trunk.fixed_bytes - plan.trunk.pinned_bytes - plan.trunk.window_bytes;
  }
  std::vector<uint64_t> capacity;
  if (opt.policy == CachePolicy::PerLayer) {
    for (int li : moe_layers) {
      layers[size_t(li)].partition = int(capacity.size());
      capacity.push_back(plan.cache_bytes / uint64_t(moe_layers.size()));
    }
  } else {
    capacity.push_back(plan.cache_bytes);
  }
  auto store = std::make_shared<ExpertStore>(std::move(files), std::move(layers), std::move(capacity), opt.uring);
  if (trunk_streams) stream_trunk(m, plan.trunk);
  for (int li : moe_layers) std::get<layers::Moe>(m.blocks[size_t(li)].ffn).source = std::make_shared<LayerSource>(store, li);
  return store;
}

StreamStats stream_stats(const ExpertStore& s) { return s.stats(); }
DiskRoofline measure_disk(ExpertStore& s, uint64_t max_bytes) { return s.measure_disk(max_bytes); }
void reset_stream_stats(ExpertStore& s) { s.reset_stats(); }
void clear_expert_cache(ExpertStore& s) { s.clear(); }
void set_stream_int8_dot(ExpertStore& s, bool on) { s.set_int8_dot(on); }

uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

uint64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && (unit.back() == 'i')) unit.pop_back();
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) used = 0;
  if (used == 0 || !(v > 0) || v * scale > 1.8e19)
    throw Error(cat(what, ": '", text, "' is not a size; expected bytes, or a number with K, M, G or T (powers of 1024), e.g. 8G"));
  return uint64_t(v * scale);
}

}  // namespace lineage::io
