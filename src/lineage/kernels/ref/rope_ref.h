// Scalar twin of kernels/rope.h, templated on the scalar type so finite differences run wholly in
// double: the rotation matrix applied as written, forward (sign +1) or transposed (sign −1).
#pragma once

#include <cmath>
#include <cstdint>

namespace lineage::kernels::ref {

// x[d] ← R(p)·x (sign +1) or R(p)ᵀ·x (sign −1), R block-diagonal with 2×2 rotations by
// p·θ^(−2i/d) on the pairs (x_2i, x_2i+1).
template <class F>
void rope_interleaved(F* x, int64_t d, int64_t p, double theta, int sign) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
    const F r00 = F(std::cos(angle)), r01 = F(-std::sin(angle)), r10 = F(std::sin(angle)), r11 = F(std::cos(angle));
    const F a = x[2 * i], b = x[2 * i + 1];
    if (sign > 0) x[2 * i] = r00 * a + r01 * b, x[2 * i + 1] = r10 * a + r11 * b;
    else x[2 * i] = r00 * a + r10 * b, x[2 * i + 1] = r01 * a + r11 * b;
  }
}

// The same with the rotate-half pairs (x_i, x_i+d/2), i < d/2.
template <class F>
void rope_neox(F* x, int64_t d, int64_t p, double theta, int sign) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
    const F c = F(std::cos(angle)), s = F(std::sin(angle)) * F(sign);
    const F a = x[i], b = x[i + half];
    x[i] = c * a - s * b, x[i + half] = s * a + c * b;
  }
}

}  // namespace lineage::kernels::ref
