// OpenBLAS runs single-threaded, always inside the engine's own threads (core/parallel.h): its own
// OpenMP team would compete with the engine's spinning workers for the same cores. The OpenMP build
// of OpenBLAS takes its thread count from the calling thread's OpenMP setting on every call, so each
// thread that calls it sets that to 1 first.
#pragma once

#include <cblas.h>
#include <omp.h>

namespace lineage::kernels {

// Call on the thread that is about to call OpenBLAS, before the call; cheap after the first time.
inline void single_threaded_blas() {
  thread_local const bool once = (omp_set_num_threads(1), openblas_set_num_threads(1), true);
  (void)once;
}

}  // namespace lineage::kernels
