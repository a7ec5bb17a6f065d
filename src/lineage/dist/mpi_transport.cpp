// The MPI transport: the only file of lineage that includes mpi.h (built with LINEAGE_HAVE_MPI).
#include "lineage/dist/transport.h"

#include "lineage/core/error.h"

#if LINEAGE_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace lineage::dist {

namespace {

// An MPI call's result: an Error naming the call and MPI's own words when it failed.
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int n = 0;
  MPI_Error_string(rc, text, &n);
  throw Error(cat("MPI: ", call, " failed: ", std::string(text, size_t(std::max(n, 0)))));
}

class Mpi final : public Transport {
 public:
  Mpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) throw Error("MPI: the transport is made once per process");
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw Error("MPI: the library does not provide MPI_THREAD_SERIALIZED");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int n = 0;
    MPI_Get_library_version(version, &n);
    library_ = std::string(version, size_t(std::max(n, 0)));
    library_ = library_.substr(0, library_.find_first_of(",\n"));
  }
  // Going away during an exception on this rank alone: the others may be waiting in a collective,
  // and MPI_Finalize would wait for them; the job is ended instead (mpirun reports it).
  ~Mpi() override {
    if (std::uncaught_exceptions() > 0) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "MPI (" + library_ + ")"; }

  void all_gather(const float* mine, std::span<const int64_t> counts, float* out) override {
    if (int64_t(counts.size()) != size_) throw Error(cat("all_gather: ", counts.size(), " counts for ", size_, " ranks"));
    counts_.resize(counts.size());
    displs_.resize(counts.size());
    int64_t at = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] < 0 || counts[r] > INT_MAX || at > INT_MAX)
        throw Error(cat("all_gather: rank ", r, "'s ", counts[r], " floats at ", at, " do not fit MPI's int counts"));
      counts_[r] = int(counts[r]);
      displs_[r] = int(at);
      at += counts[r];
    }
    // This rank's floats already at their place in `out`: MPI forbids aliased buffers, MPI_IN_PLACE says so.
    const bool in_place = mine == out + displs_[size_t(rank_)];
    check(MPI_Allgatherv(in_place ? MPI_IN_PLACE : mine, counts_[size_t(rank_)], MPI_FLOAT, out, counts_.data(),
                         displs_.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) throw Error(cat("broadcast: root ", root, " of ", size_, " ranks"));
    auto* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes;) {  // MPI counts are ints: pieces of at most 1 GiB
      const int n = int(std::min<size_t>(bytes - at, size_t(1) << 30));
      check(MPI_Bcast(p + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
      at += size_t(n);
    }
  }

  void broadcast_waiting(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) throw Error(cat("broadcast: root ", root, " of ", size_, " ranks"));
    if (bytes > size_t(INT_MAX)) throw Error(cat("broadcast_waiting: ", bytes, " bytes do not fit MPI's int count"));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &request), "MPI_Ibcast");
    // Polled without sleeping for the first 200 µs (a decoding server's next step comes sooner),
    // then with sleeps that grow to 1 ms.
    const auto start = std::chrono::steady_clock::now();
    std::chrono::microseconds nap{0};
    for (int done = 0;;) {
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(200)) continue;
      nap = std::min(std::chrono::microseconds(1000), nap + std::chrono::microseconds(50));
      std::this_thread::sleep_for(nap);
    }
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  std::optional<std::string> any_failed(bool failed, const std::string& message) override {
    int mine = failed ? rank_ : size_, first = size_;
    check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
    if (first == size_) return std::nullopt;
    uint64_t length = rank_ == first ? message.size() : 0;
    broadcast(&length, sizeof length, first);
    std::string text(size_t(length), '\0');
    if (rank_ == first) text = message;
    broadcast(text.data(), text.size(), first);
    return cat("rank ", first, ": ", text);
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; in case it does
  }

 private:
  int rank_ = 0, size_ = 1;
  std::string library_;
  std::vector<int> counts_, displs_;
};

}  // namespace

bool mpi_built() { return true; }

std::unique_ptr<Transport> mpi_transport() { return std::make_unique<Mpi>(); }

}  // namespace lineage::dist

#else

namespace lineage::dist {

bool mpi_built() { return false; }

std::unique_ptr<Transport> mpi_transport() {
  throw Error("this lineage was built without MPI (Debian's libopenmpi-dev was not found, or -DLINEAGE_MPI=OFF)");
}

}  // namespace lineage::dist

#endif
