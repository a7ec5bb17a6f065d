// Sets the engine's thread count for parallel_for and for OpenBLAS together.
#pragma once

namespace lineage::kernels {

void set_threads(int n);  // n <= 0: all hardware threads

}  // namespace lineage::kernels
