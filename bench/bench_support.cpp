#include "bench_support.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/roofline.h"

namespace lineage::bench {

namespace {
Ceilings g_ceilings;
}

const Ceilings& ceilings() { return g_ceilings; }

void measure_ceilings(int threads) {
  // The best of three rounds: another process on the cores can only lower a measurement.
  for (int round = 0; round < 3; ++round) {
    g_ceilings.bandwidth = std::max(g_ceilings.bandwidth, kernels::measure_read_bandwidth(threads));
    g_ceilings.peak_f32 = std::max(g_ceilings.peak_f32, kernels::measure_peak_flops(DType::F32, threads));
    g_ceilings.peak_bf16 = std::max(g_ceilings.peak_bf16, kernels::measure_peak_flops(DType::BF16, threads));
  }
}

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = scale * float(2.0 * rng.uniform() - 1.0);
  return v;
}

const std::vector<Tensor>& cold_weights(int64_t rows, int64_t cols, DType dtype) {
  static std::vector<Tensor> last;
  if (!last.empty() && last[0].dtype() == dtype && last[0].shape() == Shape{rows, cols}) return last;
  last.clear();
  Tensor f = Tensor::empty(DType::F32, {rows, cols});
  const auto v = random_floats(rows * cols, 1, 0.05f);
  std::copy(v.begin(), v.end(), f.data<float>());
  last.push_back(dtype == DType::F32 ? std::move(f) : convert(f, dtype));
  const size_t copies = (kColdBytes + last[0].nbytes() - 1) / last[0].nbytes();
  while (last.size() < copies) last.push_back(last[0].clone());
  return last;
}

const std::vector<Tensor>& mapped_cold_weights(int64_t rows, int64_t cols, DType dtype) {
  static std::vector<Tensor> last;
  if (!last.empty() && last[0].dtype() == dtype && last[0].shape() == Shape{rows, cols}) return last;
  last.clear();
  const std::vector<Tensor>& src = cold_weights(rows, cols, dtype);
  const size_t each = src[0].nbytes(), total = each * src.size();
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/lineage-bench-XXXXXX";
  const int fd = mkstemp(path.data());
  LINEAGE_CHECK(fd >= 0, "cannot create a temporary file at ", path);
  unlink(path.c_str());
  for (const Tensor& t : src) {
    const char* p = static_cast<const char*>(t.raw());
    for (size_t done = 0; done < each;) {
      const ssize_t n = write(fd, p + done, each - done);
      LINEAGE_CHECK(n > 0, "cannot write the temporary weight file ", path);
      done += size_t(n);
    }
  }
  void* map = mmap(nullptr, total, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  close(fd);
  LINEAGE_CHECK(map != MAP_FAILED, "cannot map the temporary weight file ", path);
  const std::shared_ptr<const void> owner(map, [total](const void* p) { munmap(const_cast<void*>(p), total); });
  for (size_t i = 0; i < src.size(); ++i)
    last.push_back(Tensor::borrow(dtype, {rows, cols}, static_cast<const char*>(map) + i * each, owner));
  return last;
}

const char* dtype_label(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    default: return "?";
  }
}

}  // namespace lineage::bench
