#include "lineage/kernels/rope.h"

#include <cmath>

namespace lineage::kernels {

namespace {

// Turns the pairs (x_2i, x_2i+1) (interleaved) or (x_i, x_i+d/2) (rotate-half) by sign·p·θ^(−2i/d).
void turn(float* x, int64_t d, int64_t p, double theta, float sign, bool half_pairs) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
    const float c = float(std::cos(angle)), s = sign * float(std::sin(angle));
    float* first = half_pairs ? x + i : x + 2 * i;
    float* second = half_pairs ? x + i + half : x + 2 * i + 1;
    const float a = *first, b = *second;
    *first = a * c - b * s;
    *second = a * s + b * c;
  }
}

}  // namespace

void rope_interleaved(float* x, int64_t d, int64_t p, double theta) { turn(x, d, p, theta, 1.0f, false); }

void rope_interleaved_backward(float* dy, int64_t d, int64_t p, double theta) { turn(dy, d, p, theta, -1.0f, false); }

void rope_neox(float* x, int64_t d, int64_t p, double theta) { turn(x, d, p, theta, 1.0f, true); }

void rope_neox_backward(float* dy, int64_t d, int64_t p, double theta) { turn(dy, d, p, theta, -1.0f, true); }

}  // namespace lineage::kernels
