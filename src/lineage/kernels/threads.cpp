#include "lineage/kernels/threads.h"

#include "lineage/core/parallel.h"
#include "lineage/kernels/blas_threads.h"

namespace lineage::kernels {

void set_threads(int n) {
  set_num_threads(n);
  single_threaded_blas();
}

}  // namespace lineage::kernels
