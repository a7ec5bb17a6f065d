// Sets the engine's thread count (core/parallel.h); OpenBLAS stays single-threaded inside those threads.
#pragma once

namespace lineage::kernels {

void set_threads(int n);  // n <= 0: all hardware threads

}  // namespace lineage::kernels
