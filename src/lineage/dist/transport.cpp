#include "lineage/dist/transport.h"

#include <cstdlib>
#include <cstring>

#include "lineage/core/error.h"

namespace lineage::dist {

namespace {

class SingleRank final : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single rank"; }
  void all_gather(const float* mine, std::span<const int64_t> counts, float* out) override {
    if (counts.size() != 1 || counts[0] < 0) throw Error(cat("all_gather: ", counts.size(), " counts for one rank"));
    if (counts[0] > 0 && mine != out) std::memmove(out, mine, size_t(counts[0]) * sizeof(float));
  }
  void broadcast(void*, size_t, int root) override {
    if (root != 0) throw Error(cat("broadcast: root ", root, " of one rank"));
  }
  void broadcast_waiting(void* data, size_t bytes, int root) override { broadcast(data, bytes, root); }
  void barrier() override {}
  std::optional<std::string> any_failed(bool failed, const std::string& message) override {
    if (failed) return cat("rank 0: ", message);
    return std::nullopt;
  }
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

}  // namespace

std::unique_ptr<Transport> single_rank() { return std::make_unique<SingleRank>(); }

bool under_mpirun() {
  // Open MPI's mpirun, or a PMIx / PMI launcher (srun) starting Open MPI's processes.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (const char* v = std::getenv(name); v && *v) return true;
  return false;
}

std::unique_ptr<Transport> world() {
  if (under_mpirun()) return mpi_transport();
  return single_rank();
}

}  // namespace lineage::dist
