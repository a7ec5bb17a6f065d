#include "lineage/io/trunk_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "lineage/core/error.h"
#include "lineage/io/mapping_guard.h"
#include "lineage/layers/common.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

namespace lineage::io {

namespace {

constexpr uintptr_t kPage = 4096;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Range {
  uintptr_t begin = 0, end = 0;  // whole pages of the mapping
  int file = 0;
  uint64_t offset = 0;           // of `begin` in the file
};

struct Unit {
  std::vector<Range> ranges;
  uint64_t bytes = 0;
  bool read_whole = true;  // false for the embedding, of which a step reads its tokens' rows
  bool pinned = false;     // stays once read (TrunkPlan::pinned)
  std::string name;
};

struct Layout {
  std::vector<Unit> units;
  std::vector<std::string> paths;
  uint64_t fixed = 0;
};

// Each unit's mapped pages, in the numbering of model::TrunkSource.
Layout layout_of(model::Model& m) {
  const size_t n = 2 * size_t(m.n_layers()) + 3;
  Layout out;
  out.units.resize(n);
  for (size_t u = 0; u < n; ++u) out.units[u].name = trunk_unit_name(u, n);
  out.units[0].read_whole = false;
  std::map<std::string, int> file_index;
  std::vector<std::vector<Range>> pieces(n);
  for_each_trunk_tensor(m, [&](const std::string&, Tensor& t, const std::vector<size_t>& units) {
    if (!t.defined() || !t.nbytes()) return;
    std::optional<MappedAt> at = t.is_borrowed() ? find_mapping(t.raw()) : std::nullopt;
    if (!at) {
      out.fixed += uint64_t(t.nbytes());
      return;
    }
    const auto [it, added] = file_index.emplace(at->path, int(out.paths.size()));
    if (added) out.paths.push_back(at->path);
    const uintptr_t b = reinterpret_cast<uintptr_t>(t.raw());
    Range r;
    r.begin = b / kPage * kPage;
    r.end = (b + t.nbytes() + kPage - 1) / kPage * kPage;
    r.file = it->second;
    r.offset = at->offset - (b - r.begin);
    for (size_t u : units) pieces[u].push_back(r);
  });
  for (size_t u = 0; u < n; ++u) {
    std::vector<Range>& p = pieces[u];
    std::sort(p.begin(), p.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    Unit& unit = out.units[u];
    for (const Range& r : p) {
      if (!unit.ranges.empty()) {
        Range& last = unit.ranges.back();
        // Overlapping or touching pages of one file, at the same distance in the file as in memory.
        if (r.begin <= last.end && r.file == last.file && r.offset - last.offset == r.begin - last.begin) {
          last.end = std::max(last.end, r.end);
          continue;
        }
      }
      unit.ranges.push_back(r);
    }
    for (const Range& r : unit.ranges) unit.bytes += r.end - r.begin;
  }
  return out;
}

// The window and the streamed bytes of p's units that are not pinned.
void settle(TrunkPlan& p) {
  std::vector<uint64_t> streamed = p.unit_bytes;
  p.streamed_bytes = p.pinned_bytes = 0;
  for (size_t u = 0; u < streamed.size(); ++u) {
    if (p.pinned[u]) p.pinned_bytes += streamed[u], streamed[u] = 0;
    p.streamed_bytes += streamed[u];
  }
  const TrunkWindow w = trunk_window(streamed);
  p.window_bytes = w.bytes;
  const size_t n = streamed.size();
  p.window_units = w.running == w.ahead ? trunk_unit_name(w.running, n)
                                        : cat(trunk_unit_name(w.running, n), " and ", trunk_unit_name(w.ahead, n));
}

TrunkPlan plan_of(const Layout& l) {
  std::vector<uint64_t> bytes;
  for (const Unit& u : l.units) bytes.push_back(u.read_whole ? u.bytes : 0);
  TrunkPlan p = trunk_plan(std::move(bytes));
  p.fixed_bytes = l.fixed;
  return p;
}

}  // namespace

class TrunkStream : public model::TrunkSource {
 public:
  explicit TrunkStream(Layout layout) : units_(std::move(layout.units)) {
    for (const std::string& path : layout.paths) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        close_files();
        throw Error(cat(path, ": cannot open it to stream the trunk: ", std::strerror(errno)));
      }
      File f{path, fd, {}};
      ::fstat(fd, &f.at_load);
      files_.push_back(std::move(f));
    }
    // No readahead on a fault in the trunk's pages (MADV_RANDOM): a unit is asked for whole
    // (POSIX_FADV_WILLNEED) before it is mapped in, and the kernel's own readahead past it would bring
    // in pages of other units, which fault-around (64 KiB about a fault) would then map.
    for (const Unit& u : units_)
      for (const Range& r : u.ranges) (void)::madvise(reinterpret_cast<void*>(r.begin), r.end - r.begin, MADV_RANDOM);
    resident_.assign(units_.size(), 1);  // until the first step drops what the load touched
    reader_ = std::thread([this] { read_ahead_loop(); });
  }
  ~TrunkStream() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reader_.join();
    close_files();
  }
  TrunkStream(const TrunkStream&) = delete;
  TrunkStream& operator=(const TrunkStream&) = delete;

  void enter(int64_t unit, int64_t next) override {
    const double t0 = now_seconds();
    std::unique_lock<std::mutex> lk(mu_);
    if (unit == 0)  // a step's start
      for (const File& f : files_) check_unchanged(f.path, f.fd, f.at_load, "the trunk");
    if (fresh_) {
      fresh_ = false;
      lk.unlock();
      drop_all();
      lk.lock();
    }
    cv_.wait(lk, [&] { return reading_ != unit; });
    if (!error_.empty()) {
      const std::string e = std::move(error_);
      error_.clear();
      throw Error(e);
    }
    if (!resident_[size_t(unit)] && units_[size_t(unit)].read_whole) {  // the embedding: its rows, as they are read
      lk.unlock();
      bring(size_t(unit));
      lk.lock();
      resident_[size_t(unit)] = 1;
    }
    stats_.wait_seconds += now_seconds() - t0;
    if (next < 0 || next >= int64_t(units_.size()) || next == unit || resident_[size_t(next)] ||
        !units_[size_t(next)].read_whole || reading_ == next)
      return;
    cv_.wait(lk, [&] { return reading_ < 0; });  // one unit read ahead at a time
    if (resident_[size_t(next)]) return;
    reading_ = next;
    cv_.notify_all();
  }

  void leave(int64_t unit) override {
    if (units_[size_t(unit)].pinned) return;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return reading_ != unit; });
      resident_[size_t(unit)] = 0;
    }
    drop(size_t(unit));
  }

  void drop_all() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return reading_ < 0; });
    for (size_t u = 0; u < units_.size(); ++u) {
      drop(u);
      resident_[u] = 0;
    }
  }

  SequentialRead measure(uint64_t max_bytes) {
    drop_all();  // the pinned units too: the probe holds one unit at a time
    std::unique_lock<std::mutex> lk(mu_);
    const TrunkStats keep = stats_;
    lk.unlock();
    SequentialRead r;
    double seconds = 0;
    for (size_t u = 1; u < units_.size() && r.bytes < max_bytes; ++u) {
      if (!units_[u].read_whole || !units_[u].bytes) continue;
      drop(u);
      const double t0 = now_seconds();
      bring(u);
      seconds += now_seconds() - t0;
      drop(u);
      r.bytes += units_[u].bytes;
    }
    r.rate = seconds > 0 ? double(r.bytes) / seconds : 0;
    lk.lock();
    std::fill(resident_.begin(), resident_.end(), 0);
    stats_ = keep;
    lk.unlock();
    drop_all();
    return r;
  }

  std::vector<std::string> paths() const {
    std::vector<std::string> out;
    for (const File& f : files_) out.push_back(f.path);
    return out;
  }

  TrunkStats stats() {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  void reset_stats() {
    std::lock_guard<std::mutex> lk(mu_);
    stats_ = TrunkStats{};
  }

 private:
  struct File {
    std::string path;
    int fd = -1;
    struct stat at_load;
  };

  void close_files() {
    for (File& f : files_)
      if (f.fd >= 0) ::close(f.fd);
    files_.clear();
  }

  // The unit's ranges read into the page cache (asked for all at once) and mapped in.
  void bring(size_t u) {
    const double t0 = now_seconds();
    const Unit& unit = units_[u];
    for (const Range& r : unit.ranges)
      (void)::posix_fadvise(files_[size_t(r.file)].fd, off_t(r.offset), off_t(r.end - r.begin), POSIX_FADV_WILLNEED);
    for (const Range& r : unit.ranges) {
      if (::madvise(reinterpret_cast<void*>(r.begin), r.end - r.begin, MADV_POPULATE_READ) == 0) continue;
      const int err = errno;
      if (err == EINVAL) {  // a kernel before 5.14: a read of each page
        for (uintptr_t p = r.begin; p < r.end; p += kPage) (void)*reinterpret_cast<const volatile char*>(p);
        continue;
      }
      throw Error(cat(files_[size_t(r.file)].path, ": bytes ", r.offset, " to ", r.offset + (r.end - r.begin), " (",
                      unit.name, " of the streamed trunk) could not be read into memory: ", std::strerror(err)));
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_.units_read += 1;
    stats_.bytes_read += unit.bytes;
    stats_.read_seconds += now_seconds() - t0;
  }

  // Out of the process and out of the page cache.
  void drop(size_t u) {
    for (const Range& r : units_[u].ranges) {
      (void)::madvise(reinterpret_cast<void*>(r.begin), r.end - r.begin, MADV_DONTNEED);
      (void)::posix_fadvise(files_[size_t(r.file)].fd, off_t(r.offset), off_t(r.end - r.begin), POSIX_FADV_DONTNEED);
    }
  }

  void read_ahead_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || reading_ >= 0; });
      if (stop_) return;
      const size_t u = size_t(reading_);
      lk.unlock();
      std::string failed;
      try {
        bring(u);
      } catch (const Error& e) {
        failed = e.what();
      }
      lk.lock();
      if (failed.empty()) resident_[u] = 1;
      else error_ = failed;
      reading_ = -1;
      cv_.notify_all();
    }
  }

  std::vector<Unit> units_;
  std::vector<File> files_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> resident_;  // brought in and not left since
  int64_t reading_ = -1;        // the unit the reader is bringing in
  bool stop_ = false, fresh_ = true;
  std::string error_;           // the reader's failure, thrown by the next enter()
  TrunkStats stats_;
  std::thread reader_;
};

void for_each_trunk_tensor(model::Model& m,
                           const std::function<void(const std::string&, Tensor&, const std::vector<size_t>&)>& f) {
  const size_t L = m.blocks.size(), final_unit = 2 * L + 1, head = 2 * L + 2;
  // Each block's channel-mixer side (its AttnRes mix, norm and ffn); the rest of a block is its mixer's.
  std::unordered_map<const Tensor*, size_t> ffn_side;
  for (size_t i = 0; i < L; ++i) {
    model::Block& b = m.blocks[i];
    const layers::TensorVisitor mark = [&, i](const std::string&, Tensor& t, const Shape&, layers::Init) {
      ffn_side[&t] = 2 * i + 2;
    };
    if (b.mlp_res.defined()) b.mlp_res.for_each_tensor("", "", mark);
    b.norm2.for_each_tensor("", mark);
    std::visit([&](auto& ffn) { ffn.for_each_tensor("", mark); }, b.ffn);
  }
  const auto starts = [](const std::string& name, const std::string& prefix) {
    return !prefix.empty() && name.rfind(prefix, 0) == 0;
  };
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    std::vector<size_t> units;
    if (const auto it = ffn_side.find(&t); it != ffn_side.end()) {
      units = {it->second};
    } else if (starts(name, m.names.layer_prefix)) {
      size_t i = 0, at = m.names.layer_prefix.size();
      for (; at < name.size() && name[at] >= '0' && name[at] <= '9'; ++at) i = i * 10 + size_t(name[at] - '0');
      units = {i < L ? 2 * i + 1 : final_unit};
    } else if (starts(name, m.names.embed)) {
      units = m.config.tied_lm_head ? std::vector<size_t>{0, head} : std::vector<size_t>{0};
    } else if (starts(name, m.names.pos_embed)) {
      units = {0};
    } else if (!m.config.tied_lm_head && starts(name, m.names.lm_head)) {
      units = {head};
    } else {
      units = {final_unit};  // the final norm and the model-level AttnRes mix
    }
    f(name, t, units);
  });
}

std::string trunk_unit_name(size_t u, size_t units) {
  if (u == 0) return "the embedding";
  if (u + 1 == units) return "the head";
  if (u + 2 == units) return "the final norm";
  return cat("block ", (u - 1) / 2, u % 2 ? "'s mixer" : "'s ffn");
}

// model/forward.cpp's order: each unit reads the next ahead, the last block's ffn the head (block 0's
// mixer for a step without logits), the final norm the head, the head block 0's mixer.
TrunkWindow trunk_window(const std::vector<uint64_t>& b) {
  TrunkWindow w;
  if (b.size() < 4) return w;
  const size_t n = b.size(), head = n - 1, final_unit = n - 2, first = 1, last = n - 3;
  const auto pair = [&](size_t a, size_t c) {
    const uint64_t bytes = a == c ? b[a] : b[a] + b[c];
    if (bytes > w.bytes || w.running == 0) w = {bytes, a, c};
  };
  for (size_t u = first; u < last; ++u) pair(u, u + 1);
  pair(last, head);
  pair(last, first);
  pair(final_unit, head);
  pair(head, first);
  return w;
}

TrunkPlan trunk_plan(std::vector<uint64_t> unit_bytes) {
  TrunkPlan p;
  p.unit_bytes = std::move(unit_bytes);
  p.unit_bytes[0] = 0;  // the embedding: a step reads its rows
  p.pinned.assign(p.unit_bytes.size(), 0);
  settle(p);
  return p;
}

TrunkPlan plan_trunk(model::Model& m) { return plan_of(layout_of(m)); }

void pin_units(TrunkPlan& p, uint64_t room) {
  std::vector<size_t> order;
  for (size_t u = 0; u < p.unit_bytes.size(); ++u)
    if (p.unit_bytes[u] && !p.pinned[u]) order.push_back(u);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p.unit_bytes[a] > p.unit_bytes[b]; });
  for (const size_t u : order) {
    TrunkPlan trial = p;
    trial.pinned[u] = 1;
    settle(trial);
    if (trial.pinned_bytes + trial.window_bytes <= room) p = std::move(trial);
  }
}

std::shared_ptr<TrunkStream> stream_trunk(model::Model& m, const TrunkPlan& plan) {
  Layout layout = layout_of(m);
  for (size_t u = 0; u < layout.units.size() && u < plan.pinned.size(); ++u) layout.units[u].pinned = plan.pinned[u];
  // A tied head is the embedding: pinned, its pages are not the embedding's to drop after a step.
  Unit &embedding = layout.units[0], &head = layout.units.back();
  if (head.pinned && m.config.tied_lm_head) embedding.pinned = true;
  auto t = std::make_shared<TrunkStream>(std::move(layout));
  m.trunk = t;
  return t;
}

std::shared_ptr<TrunkStream> trunk_of(const model::Model& m) { return std::dynamic_pointer_cast<TrunkStream>(m.trunk); }

SequentialRead measure_trunk_reads(TrunkStream& t, uint64_t max_bytes) { return t.measure(max_bytes); }

DiskRoofline measure_disk(TrunkStream& t, uint64_t max_bytes) {
  DiskRoofline d;
  std::vector<int> fds;
  bool direct = false, buffered = false;
  for (const std::string& path : t.paths()) {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    (fd >= 0 ? direct : buffered) = true;
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) fds.push_back(fd);
  }
  try {
    const SequentialRead seq = read_sequentially(fds, max_bytes);
    d.sequential_bytes = seq.bytes, d.sequential = seq.rate;
  } catch (const Error&) {
    for (int fd : fds) ::close(fd);
    throw;
  }
  for (int fd : fds) ::close(fd);
  d.how = direct && buffered ? "O_DIRECT and buffered" : direct ? "O_DIRECT" : "buffered";
  return d;
}

TrunkStats trunk_stats(TrunkStream& t) { return t.stats(); }
void reset_trunk_stats(TrunkStream& t) { t.reset_stats(); }

}  // namespace lineage::io
