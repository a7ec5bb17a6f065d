// What the streamed experts (expert_stream.h) and the streamed trunk (trunk_stream.h) share about the
// checkpoint files they read under a memory budget: a file that changed under the run is an error
// naming it, and the disk's read roofline the benchmark prints next to what the reads achieved.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lineage::io {

// An Error naming `path` when the file open as `fd` has another size or modification time than
// `at_load` (fstat's at the load): it changed under the run. `what`: what lineage streams from it.
void check_unchanged(const std::string& path, int fd, const struct stat& at_load, const std::string& what);

// Reads up to `max_bytes` from the start of each of `fds` in turn, 4 MiB at a time into one
// page-aligned buffer (fit for O_DIRECT): the bytes read and their rate in bytes/s.
struct SequentialRead {
  uint64_t bytes = 0;
  double rate = 0;
};
SequentialRead read_sequentially(const std::vector<int>& fds, uint64_t max_bytes);

// The disk's own read roofline over the streamed files, measured in the benchmark's run: sequential
// reads from their start (4 MiB each, one at a time), up to 64 whole experts chosen at random read at
// once (in parallel, as a step's misses are), and a streamed trunk's units read as its reader reads
// them. O_DIRECT where the files were opened so; a buffered file reads what the page cache holds at
// memory speed (`how` says which).
struct DiskRoofline {
  double sequential = 0, random = 0;  // bytes/s
  uint64_t sequential_bytes = 0, random_bytes = 0;
  double trunk = 0;                   // the trunk's units (measure_trunk_reads, trunk_stream.h)
  uint64_t trunk_bytes = 0;
  int64_t random_reads = 0;
  std::string how;
};

}  // namespace lineage::io
