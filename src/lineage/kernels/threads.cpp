#include "lineage/kernels/threads.h"

#include <cblas.h>

#include "lineage/core/parallel.h"

namespace lineage::kernels {

void set_threads(int n) {
  set_num_threads(n);
  openblas_set_num_threads(num_threads());
}

}  // namespace lineage::kernels
