// The one place that asks the CPU what it can do and picks the kernel tables.
#include <cpuid.h>

#include <cstdlib>
#include <cstring>

#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {

namespace {

bool os_saves_zmm() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6) == 0xe6;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
}

bool os_saves_ymm() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6) == 0x6;
}

const GemvTable& detect() {
  if (const char* forced = std::getenv("LINEAGE_ISA")) {
    if (!std::strcmp(forced, "scalar")) return gemv_table_scalar();
    if (!std::strcmp(forced, "avx2")) return gemv_table_avx2();
  }
  unsigned a, b, c, d;
  const bool l1 = __get_cpuid(1, &a, &b, &c, &d);
  const bool fma = l1 && (c & bit_FMA), f16c = l1 && (c & bit_F16C);
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
  const bool avx2 = (b7 & bit_AVX2) && fma && f16c && os_saves_ymm();
  const bool avx512 = avx2 && (b7 & bit_AVX512F) && (b7 & bit_AVX512BW) && (b7 & bit_AVX512VL) &&
                      (b7 & bit_AVX512DQ) && os_saves_zmm();
  if (avx512) return gemv_table_avx512();
  if (avx2) return gemv_table_avx2();
  return gemv_table_scalar();
}

}  // namespace

const GemvTable& gemv_table() {
  static const GemvTable& table = detect();
  return table;
}

const char* isa_name() { return gemv_table().isa; }

}  // namespace lineage::kernels
