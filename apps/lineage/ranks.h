// The ranks a command runs among: one process, or P processes started by `mpirun -np P lineage ...`
// (issue 41, docs/distributed.md). Under mpirun every rank loads the model and runs the same command;
// each linear map's output rows are split among the ranks and gathered (kernels/row_split.h), so
// every rank holds the whole result, bit for bit what one process computes. Rank 0 alone prints and
// writes files.
#pragma once

#include <cstddef>
#include <string>

#include "lineage/dist/transport.h"
#include "lineage/model/model.h"
#include "lineage/runtime/engine.h"

namespace lineage::app {

// Starts the ranks (MPI under mpirun, else one rank), installs the row split where there are several,
// and sends the standard output of every rank but rank 0 to /dev/null. `command`: the subcommand
// about to run; one that cannot run across ranks (serve, chat, train, ...) is an Error naming those
// that can, before any model loads.
void start_ranks(const std::string& command);
// The transport (the single rank before start_ranks).
dist::Transport& ranks();
// Matrices smaller than this many bytes are computed whole on every rank, not split: $LINEAGE_TP_MIN_BYTES
// (K, M, G), 1 MiB when unset.
size_t split_min_bytes();
// Whether this process prints and writes files: rank 0.
bool is_root();
// The command failed on this rank with `message` (already printed): with several ranks, ends the
// job (the others may wait in a collective) with exit code `code`. Returns otherwise.
void fail_ranks(int code);
// Prints `what` as this rank's error ("lineage: error (rank R of P): ..." where there are several)
// and ends the job where there are several ranks (exit status 2); returns 2 otherwise.
int failed(const char* what);
// A state file (--state-in, --state-out) holds one process's whole state: with several ranks, each
// holding only its heads' recurrent states, an Error naming `option`.
void state_files_on_one_rank(const std::string& option, const std::string& file);
// --parallel: "expert" places the routed experts by rank (kernels::RowSplit::experts_by_rank),
// "tensor" splits them by rows as every matrix; nothing with one rank.
void set_parallel(const std::string& mode);
// Under mpirun with several ranks, for weights mapped from the files: the pages of the rows (and,
// with --parallel expert, the routed experts) this rank never reads leave its address space
// (io::unmap_pages), so that it maps only its slice. Matrices some rank reads otherwise stay whole:
// MLA's kv_b_proj (its heads' W_UV are views of it), the routed experts where the split leaves them
// whole, the tied head and embeddings. Returns the bytes released.
size_t release_unowned(model::Model& m);
// The serving engine's ranks (lineage serve under mpirun): rank 0's rounds broadcast over the
// transport, the row split installed on the engine's thread, a failure on one rank ending the job.
runtime::EngineRanks engine_ranks();
// Ends the ranks (MPI finalized) after a command that succeeded on every rank.
void end_ranks();

}  // namespace lineage::app
