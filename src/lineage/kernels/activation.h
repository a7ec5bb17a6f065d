// Elementwise activations, in place over n floats.
#pragma once

#include <cstdint>

namespace lineage::kernels {

enum class Activation : uint8_t { GeluTanh, GeluErf, Silu, Relu, Sigmoid };

// x[i] = act(x[i]). GeluTanh is HF's gelu_new: 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³))).
void activate(Activation act, float* x, int64_t n);
// The same on the calling thread alone (for kernels already inside a parallel region).
void activate_serial(Activation act, float* x, int64_t n);

}  // namespace lineage::kernels
