// What the backward kernels' tests share: seeded inputs in double, central finite differences of a
// double function against an analytic gradient, and f32 results against a double oracle by relative
// RMS naming the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lineage/core/rng.h"

namespace lineage::test {

using Vec = std::vector<double>;

inline Vec randn(int64_t n, uint64_t seed, double sigma = 1.0, double mean = 0.0) {
  Rng r(seed);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = mean + sigma * double(r.normal());
  return v;
}

inline std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ‖a − b‖ / ‖b‖ in double.
inline double rel_err(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

// Central differences of f with respect to every element of p (step 1e-6 relative), against
// `analytic`: relative error ≤ 1e-6.
inline void expect_fd(Vec& p, const std::function<double()>& f, const Vec& analytic, const std::string& what) {
  Vec fd(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i], h = 1e-6 * std::max(1.0, std::fabs(keep));
    p[i] = keep + h;
    const double up = f();
    p[i] = keep - h;
    const double down = f();
    p[i] = keep;
    fd[i] = (up - down) / (2 * h);
  }
  EXPECT_LE(rel_err(analytic, fd), 1e-6) << what;
}

// ‖a − b‖ / ‖b‖ of f32 results against the double oracle ≤ tol, naming the worst element; an
// all-zero oracle is held absolutely (RMS ≤ tol).
inline void expect_close(const float* a, const Vec& b, double tol, const std::string& what) {
  double num = 0, den = 0, worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = double(a[i]) - b[i];
    num += d * d, den += b[i] * b[i];
    if (std::fabs(d) > worst) worst = std::fabs(d), at = i;
  }
  if (den == 0) den = double(b.size());
  EXPECT_LE(std::sqrt(num / den), tol) << what << ": worst element " << at << " is " << a[at] << ", expected " << b[at];
}

}  // namespace lineage::test
