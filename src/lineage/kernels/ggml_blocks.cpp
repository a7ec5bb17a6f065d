// ggml's block formats (linear.h, GgmlBlock): their sizes and type ids (ggml-common.h's block structs,
// ggml.h's enum ggml_type).
#include <array>
#include <cstdint>
#include <span>

#include "lineage/kernels/linear.h"

namespace lineage::kernels {

namespace {
constexpr std::array<GgmlBlockInfo, 11> kBlocks = {{
    {GgmlBlock::Q4_0, "Q4_0", 2, 32, 18},
    {GgmlBlock::Q4_1, "Q4_1", 3, 32, 20},
    {GgmlBlock::Q5_0, "Q5_0", 6, 32, 22},
    {GgmlBlock::Q5_1, "Q5_1", 7, 32, 24},
    {GgmlBlock::Q8_0, "Q8_0", 8, 32, 34},
    {GgmlBlock::Q2_K, "Q2_K", 10, 256, 84},
    {GgmlBlock::Q3_K, "Q3_K", 11, 256, 110},
    {GgmlBlock::Q4_K, "Q4_K", 12, 256, 144},
    {GgmlBlock::Q5_K, "Q5_K", 13, 256, 176},
    {GgmlBlock::Q6_K, "Q6_K", 14, 256, 210},
    {GgmlBlock::MXFP4, "MXFP4", 39, 32, 17},
}};
}  // namespace

std::span<const GgmlBlockInfo> ggml_blocks() { return kBlocks; }

const GgmlBlockInfo& ggml_block_info(GgmlBlock b) { return kBlocks[static_cast<size_t>(b)]; }

const GgmlBlockInfo* ggml_block_of_type(uint32_t id) {
  for (const GgmlBlockInfo& b : kBlocks)
    if (b.type_id == id) return &b;
  return nullptr;
}

}  // namespace lineage::kernels
