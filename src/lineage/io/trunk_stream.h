// The trunk streamed from the checkpoint's files a sublayer at a time (issue #40), for a model whose
// weights other than the routed experts do not fit the memory budget (K3's 106 GiB trunk; a dense
// model bigger than RAM). The weights stay mapped from the files; model::forward() names each unit
// before it reads it (model::TrunkSource: the embedding's rows, each block's token mixer and its
// channel mixer, the final norm, the head). A unit is brought in whole before it runs (the page cache asked to read its file ranges
// ahead, then its pages mapped in with MADV_POPULATE_READ), and the unit forward() reads next is
// brought in the same way by a reader thread while this one computes. After a unit has run, its
// pages leave the process (MADV_DONTNEED) and the page cache (POSIX_FADV_DONTNEED), so the next
// token reads them from the disk again rather than from memory the budget did not grant.
//
// Resident at any moment: the unit that runs and the one read ahead (the plan's window), the units
// the budget pins (held once read), the weights the load copied (fixed), and the expert cache. The logits are the resident run's bits: the same
// bytes are read at the same addresses.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lineage/io/stream_files.h"
#include "lineage/model/model.h"

namespace lineage::io {

struct TrunkPlan {
  uint64_t streamed_bytes = 0;  // the units read each step, whole pages (the pinned ones left out)
  uint64_t fixed_bytes = 0;     // trunk weights held in the engine's own memory (decoded at load)
  uint64_t window_bytes = 0;    // the most that two streamed units held together (one running, one read ahead) take
  std::string window_units;     // which two, for messages ("block 0's ffn and the head")
  std::vector<uint64_t> unit_bytes;  // per unit (model::TrunkSource numbering), pinned or not
  // Units the budget holds resident once read (pin_units): each byte of one saves a byte read per
  // token, which no cached expert does (a token reads an expert at most once a layer).
  std::vector<char> pinned;
  uint64_t pinned_bytes = 0;
};

// The plan of units of these bytes (as stored, or mapped), none pinned: `lineage info`'s, from a config.
TrunkPlan trunk_plan(std::vector<uint64_t> unit_bytes);
// Pins the largest units first while the pinned bytes + the window of the units left streaming fit
// in `room` (the budget less the fixed bytes and the experts' minimum); recomputes the window.
void pin_units(TrunkPlan& p, uint64_t room);

struct TrunkStats {
  uint64_t units_read = 0, bytes_read = 0;  // units brought in, and their bytes
  double wait_seconds = 0;                  // time forward() waited for a unit
  double read_seconds = 0;                  // time spent bringing units in (the reader's and forward's)
};

class TrunkStream;

// Every tensor m.for_each_tensor visits, with the units (model::TrunkSource's numbering) it belongs
// to: the tied embedding to both the embedding's and the head's.
void for_each_trunk_tensor(model::Model& m,
                           const std::function<void(const std::string&, Tensor&, const std::vector<size_t>&)>& f);
// A unit's name for messages ("block 3's mixer", "the head").
std::string trunk_unit_name(size_t unit, size_t units);
// What a step holds at once, from each unit's bytes (a pinned unit's and the embedding's counted as 0):
// the unit that runs and the one model::forward() reads ahead, at their largest.
struct TrunkWindow {
  uint64_t bytes = 0;
  size_t running = 0, ahead = 0;
};
TrunkWindow trunk_window(const std::vector<uint64_t>& unit_bytes);

// The plan for streaming m's trunk: each unit's mapped pages. Tensors not in a mapped file count as
// fixed. Call after the routed experts have left the model (stream_experts), so their pages are in
// no unit.
TrunkPlan plan_trunk(model::Model& m);
// Makes m's trunk stream (m.trunk) as `plan` says (its pinned units stay once read): opens the files
// and starts the reader. Returns the stream, for its statistics.
std::shared_ptr<TrunkStream> stream_trunk(model::Model& m, const TrunkPlan& plan);
// m's stream, or null when its trunk is resident.
std::shared_ptr<TrunkStream> trunk_of(const model::Model& m);
TrunkStats trunk_stats(TrunkStream& t);
void reset_trunk_stats(TrunkStream& t);
// The disk's roofline for the trunk's own reads: whole units, from block 0's mixer on until
// `max_bytes`, each dropped, then brought in as the reader brings one (asked for whole, then mapped
// in), then dropped again. Waits for the reader; leaves the statistics as they were.
SequentialRead measure_trunk_reads(TrunkStream& t, uint64_t max_bytes);
// The sequential probe alone, over the trunk's files (a model without routed experts; the experts'
// store measures the rest, expert_stream.h).
DiskRoofline measure_disk(TrunkStream& t, uint64_t max_bytes);

}  // namespace lineage::io
