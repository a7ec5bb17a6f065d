#include "lineage/kernels/rope.h"

#include <cmath>

namespace lineage::kernels {

namespace {

void turn(float* x, int64_t d, int64_t p, double theta, float sign) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
    const float c = float(std::cos(angle)), s = sign * float(std::sin(angle));
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

}  // namespace

void rope_interleaved(float* x, int64_t d, int64_t p, double theta) { turn(x, d, p, theta, 1.0f); }

void rope_interleaved_backward(float* dy, int64_t d, int64_t p, double theta) { turn(dy, d, p, theta, -1.0f); }

void rope_neox(float* x, int64_t d, int64_t p, double theta) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
    const float c = float(std::cos(angle)), s = float(std::sin(angle));
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

}  // namespace lineage::kernels
