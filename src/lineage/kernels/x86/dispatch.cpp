// The one place that asks the CPU what it can do and picks the kernel tables.
#include <cpuid.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lineage/kernels/x86/gemm.h"
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

// The widest table the CPU and OS support, narrowed to LINEAGE_ISA=avx2|scalar when set (never widened:
// "avx512" on a CPU without it gets what the CPU has).
const GemvTable& detect() {
  unsigned a, b, c, d;
  const bool l1 = __get_cpuid(1, &a, &b, &c, &d);
  const bool fma = l1 && (c & bit_FMA), f16c = l1 && (c & bit_F16C);
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
  bool avx2 = (b7 & bit_AVX2) && fma && f16c && os_saves_ymm();
  bool avx512 = avx2 && (b7 & bit_AVX512F) && (b7 & bit_AVX512BW) && (b7 & bit_AVX512VL) &&
                (b7 & bit_AVX512DQ) && os_saves_zmm();
  if (const char* forced = std::getenv("LINEAGE_ISA")) {
    if (!std::strcmp(forced, "scalar")) avx2 = avx512 = false;
    else if (!std::strcmp(forced, "avx2")) avx512 = false;
    else if (std::strcmp(forced, "avx512"))
      std::fprintf(stderr, "lineage: LINEAGE_ISA=%s is not one of scalar, avx2, avx512; ignored\n", forced);
  }
  if (avx512) return gemv_table_avx512();
  if (avx2) return gemv_table_avx2();
  return gemv_table_scalar();
}

// vdpbf16ps and vcvtne2ps2bf16: CPUID leaf 7 sub-leaf 1, EAX bit 5.
bool has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

// vpdpbusd on 512-bit registers: CPUID leaf 7 sub-leaf 0, ECX bit 11.
bool has_avx512_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11));
}

}  // namespace

const GemvQuant* gemv_quant_int8() {
  static const GemvQuant* table =
      !std::strcmp(gemv_table().isa, "avx512") && has_avx512_vnni() ? &gemv_quant_int8_avx512vnni() : nullptr;
  return table;
}

const GemmTable& gemm_table() {
  static const GemmTable table = [] {
    GemmTable t{gemv_table().isa, nullptr, nullptr, nullptr, nullptr};
    if (!std::strcmp(t.isa, "avx512")) {
      t.exact = &gemm_exact_avx512();
      t.exact_strips = &gemm_exact_strips_avx512();
      t.mxfp4 = &gemm_mxfp4_avx512();
      if (has_avx512_bf16()) t.bf16_dot = &gemm_bf16_dot_avx512bf16();
    }
    return t;
  }();
  return table;
}

const GemvBf16Dot* gemv_bf16_dot() {
  return gemm_table().bf16_dot ? &gemv_bf16_dot_avx512bf16() : nullptr;
}

const GemvMxfp4Dot* gemv_mxfp4_dot() {
  return gemm_table().bf16_dot ? &gemv_mxfp4_dot_avx512bf16() : nullptr;
}

const GemvTable& gemv_table() {
  static const GemvTable& table = detect();
  return table;
}

const char* isa_name() { return gemv_table().isa; }

}  // namespace lineage::kernels
