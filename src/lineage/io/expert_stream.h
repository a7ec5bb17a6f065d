// Routed experts streamed from the checkpoint's files under a memory budget (issue #40): what must
// stay resident (the trunk: embeddings, attention / KDA / MLA weights, norms, routers, shared experts,
// the head) stays mapped; the routed experts are read as the router chooses them into an expert
// cache bounded by what the budget leaves, and the mapping's pages of them are never touched.
//
// Reads: one per expert where its tensors lie together in the file (ranges closer than 64 KiB joined),
// issued for all of a step's missing experts at once, in file-offset order, through io_uring (a
// pread loop where the kernel or the build has none), with O_DIRECT where the file system allows it
// (buffered reads otherwise). Each read covers whole 4 KiB pages, so a tensor lands at the same
// address modulo 4096 as in the mapping: the kernels take the same paths and the logits are the
// same bits as the resident run's. The MoE layer runs expert j while the reads of the ones after it
// complete. The cache is LRU, over all layers (CachePolicy::Global) or split evenly between them
// (PerLayer); a hit is an expert resident when the router asks for it.
//
// Faults are Errors naming the file: a read error, a short read (the file shrank), a file whose size
// or modification time changed since the load; a budget below the plan's minimum names the minimum.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lineage/io/stream_files.h"
#include "lineage/io/trunk_stream.h"
#include "lineage/model/model.h"

namespace lineage::io {

enum class CachePolicy : uint8_t { Global, PerLayer };

struct StreamOptions {
  // Bytes the weights may hold resident: the trunk + the expert cache. The sequences' state and the
  // step's workspace come on top (info and bench report them).
  uint64_t budget = 0;
  CachePolicy policy = CachePolicy::Global;
  bool direct = true;           // O_DIRECT where the file system allows it
  bool uring = true;            // io_uring where available; false: the pread loop
  // Whether a trunk that does not fit may stream layer by layer (trunk_stream.h); where it may not,
  // `no_trunk_stream` says why, for the message (e.g. "across ranks").
  bool trunk = true;
  std::string no_trunk_stream;
};

// What a model needs under a budget: the resident part, the routed experts, and the smallest budget
// that runs it streaming (resident + the largest expert; per layer: + one expert for each MoE layer).
struct StreamPlan {
  uint64_t budget = 0;
  uint64_t resident_bytes = 0;   // every weight but the routed experts, as stored
  uint64_t routed_bytes = 0;     // the routed experts, as read (whole pages)
  uint64_t largest_expert = 0;   // bytes
  uint64_t minimum_budget = 0;
  uint64_t cache_bytes = 0;      // what the budget leaves for experts (streaming)
  int64_t experts = 0, moe_layers = 0;
  bool streaming = false;        // the model does not fit the budget whole
  // The trunk streamed layer by layer, when even it does not fit with the largest expert: the
  // minimum is then its fixed bytes + its window + the experts' minimum.
  bool trunk_streamed = false;
  TrunkPlan trunk;
};

struct StreamStats {
  uint64_t requests = 0, hits = 0, misses = 0;   // experts asked for; resident when asked; read
  uint64_t reads = 0, bytes_read = 0;            // read calls (one per joined range) and their bytes
  uint64_t evictions = 0;
  double read_wait_seconds = 0;                  // time the layers waited on reads
  uint64_t peak_cache_bytes = 0;
  std::string io;                                // "io_uring, O_DIRECT", "pread, buffered", ...
};

class ExpertStore;

// Plans `m` under `opt` and, where it does not fit whole, makes its routed experts stream (each MoE
// layer's Moe::source): their tensors move to the store, the model keeps their shapes and formats.
// Where the rest does not fit either (or the model has no routed experts), the trunk streams layer
// by layer (trunk_stream.h; m.trunk, trunk_of(m)).
// Called on a bound model before its checks and preparation (load_checkpoint), the experts must lie
// in mapped checkpoint files as stored (decoded GGUF experts are an Error naming them). Returns the
// store (null when everything fits); the plan is filled either way. Throws Error for a budget below
// the minimum.
std::shared_ptr<ExpertStore> stream_experts(model::Model& m, const StreamOptions& opt, StreamPlan& plan);

// The disk's read roofline over the experts' files, measured now (stream_files.h): the sequential and
// random probes.
DiskRoofline measure_disk(ExpertStore& s, uint64_t max_bytes);

StreamStats stream_stats(const ExpertStore& s);
void reset_stream_stats(ExpertStore& s);
// Drops every cached expert (a cold start for a benchmark).
void clear_expert_cache(ExpertStore& s);
// The streamed int4 / int8 experts multiplied with int8 activations (model::set_int8_dot's choice for
// the resident matrices; the CLI's --int8-dot).
void set_stream_int8_dot(ExpertStore& s, bool on);

// Fault injection for the tests: the `nth` expert read completed from now on (1: the next) fails with
// errno `err` (> 0), or comes back one byte short of what it needed (err = 0), as a damaged disk or a
// file cut under the run would; nth = 0 disarms it. Process-wide, for every store and both read paths
// (io_uring and pread).
void inject_read_fault(int64_t nth, int err);

// /proc/meminfo's MemAvailable in bytes (0 when unreadable): the default budget.
uint64_t available_memory();

// "4G", "512M", "100K", "12345" (bytes); K/M/G/T powers of 1024. Throws Error naming `what`.
uint64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace lineage::io
