// Room dist/: the collectives lineage's ranks use to run one model across processes and machines
// (issue 41's transport): all-gather(v), broadcast, barrier, and a collective "did any rank fail" so
// that one rank's error ends every rank with its message instead of a hang. Two implementations: one
// rank with no MPI at all, and Open MPI (Debian's libopenmpi-dev; built when found, -DLINEAGE_MPI=OFF
// leaves it out), in mpi_transport.cpp, the only file that includes mpi.h. Uses core.
// docs/distributed.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace lineage::dist {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single rank" or "MPI (Open MPI ...)"

  // Every rank's counts[r] floats, gathered in rank order into `out` (their sum long), on every
  // rank; `mine` holds this rank's counts[rank()]. counts must be the same on every rank.
  virtual void all_gather(const float* mine, std::span<const int64_t> counts, float* out) = 0;
  // `bytes` bytes of `data` from rank `root` to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // The same, for a message the other ranks may wait for a long time (a server's next step, while
  // rank 0 waits for requests): a rank that waits polls and then sleeps between polls instead of
  // holding its core. Not to be mixed with broadcast(): every rank calls the same one.
  virtual void broadcast_waiting(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Collective: every rank says whether it failed (and why); every rank gets the message of the
  // lowest-numbered rank that failed, or nothing when none did.
  virtual std::optional<std::string> any_failed(bool failed, const std::string& message) = 0;
  // Ends every rank's process with exit status `code` (MPI_Abort; one rank: exit), for an error on
  // this rank alone that the others cannot learn of in a collective they are waiting in.
  [[noreturn]] virtual void abort(int code) = 0;
};

// One process, no communication: all_gather copies, broadcast and barrier do nothing.
std::unique_ptr<Transport> single_rank();

// Whether this build has the MPI transport.
bool mpi_built();
// Whether this process was started by mpirun or a PMIx / PMI launcher (their environment says so).
bool under_mpirun();
// The MPI transport over MPI_COMM_WORLD, MPI initialized with MPI_THREAD_SERIALIZED (one thread at a
// time calls MPI: the one that made it, or a server's engine thread while the main thread waits; the
// kernels' worker threads never do) and errors returned, not aborted: each is an Error naming the call. One per process; MPI is finalized when it goes. Throws Error
// when the build has no MPI.
std::unique_ptr<Transport> mpi_transport();

// The MPI transport under mpirun, the single rank otherwise.
std::unique_ptr<Transport> world();

}  // namespace lineage::dist
