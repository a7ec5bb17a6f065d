// Matrices of random ggml blocks (linear.h GgmlBlock) for the tests (ggml_test.cpp) and the
// micro-benchmarks (bench_linear.cpp): random code bytes, f16 scales of either sign between 2^-9 and
// 2^-3 (MXFP4: exponents 2^-10 .. 2^4), prepared as the GGUF loader prepares a tensor.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/rng.h"
#include "lineage/core/tensor.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"

namespace lineage::kernels::packed_test {

inline void put_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Where each format keeps its f16 scales (the rest of a block is codes and packed sub-scales).
inline std::vector<int> half_offsets(GgmlBlock b) {
  switch (b) {
    case GgmlBlock::Q4_0:
    case GgmlBlock::Q5_0:
    case GgmlBlock::Q8_0: return {0};
    case GgmlBlock::Q4_1:
    case GgmlBlock::Q5_1:
    case GgmlBlock::Q4_K:
    case GgmlBlock::Q5_K: return {0, 2};
    case GgmlBlock::Q2_K: return {80, 82};
    case GgmlBlock::Q3_K: return {108};
    case GgmlBlock::Q6_K: return {208};
    case GgmlBlock::MXFP4: return {};
  }
  return {};
}

// A matrix of random blocks: random code bytes, scales of either sign between 2^-9 and 2^-3 (MXFP4:
// exponents 2^-10 .. 2^4), prepared as the loader prepares a GGUF tensor.
inline Matrix random_blocks(GgmlBlock type, int64_t out, int64_t in, uint64_t seed) {
  const GgmlBlockInfo& info = ggml_block_info(type);
  Matrix m;
  m.out = out, m.in = in;
  m.quant.kind = StoredQuant::Kind::Ggml;
  m.quant.ggml = type;
  m.quant.origin = info.name;
  m.data = Tensor::empty(DType::U8, {out, in / info.values * info.bytes});
  Rng rng(seed);
  auto* p = m.data.data<uint8_t>();
  for (int64_t i = 0; i < m.data.numel(); ++i) p[i] = uint8_t(rng.next_u64());
  for (int64_t blk = 0; blk < m.data.numel() / info.bytes; ++blk) {
    uint8_t* b = p + blk * info.bytes;
    for (int off : half_offsets(type))
      put_half(b + off, float((rng.next_u64() & 1) ? -1 : 1) * std::ldexp(1.0f + float(rng.uniform()), -9 + int(rng.next_u64() % 6)));
    if (type == GgmlBlock::MXFP4) b[0] = uint8_t(118 + rng.next_u64() % 15);
  }
  prepare_quant(m, "w.weight");
  return m;
}

}  // namespace lineage::kernels::packed_test
