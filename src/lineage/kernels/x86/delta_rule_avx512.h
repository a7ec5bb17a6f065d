// AVX-512 delta rule: the chunked WY / UT form of docs/math/delta_rule.md §3, one value head at a time,
// and the recurrent sweep of §2.
#pragma once

#include <cstdint>

#include "lineage/kernels/delta_rule.h"

namespace lineage::kernels {

// True when delta_rule_chunked_heads_avx512 handles these arguments: K and V multiples of 16, no
// normalizer. The caller also checks that the CPU runs AVX-512 (gemv_table().isa).
bool delta_rule_chunked_avx512_supports(const DeltaRuleArgs& a);

// Value heads [j0, j1) of delta_rule_chunked, chunk in [1, 64]. Each head's arithmetic is independent
// of the others, so results do not depend on how heads are split across threads.
void delta_rule_chunked_heads_avx512(const DeltaRuleArgs& a, int64_t j0, int64_t j1, int chunk);

// delta_rule_recurrent when K and V are multiples of 16 and there is no normalizer: the same fused
// sweep, 16 lanes wide, over work items that are blocks of up to 64 of a value head's state columns
// (kept in registers). Items [i0, i1) of delta_rule_recurrent_avx512_items;
// no column's arithmetic depends on the blocks or their order, so results do not depend on the split.
bool delta_rule_recurrent_avx512_supports(const DeltaRuleArgs& a);
int64_t delta_rule_recurrent_avx512_items(const DeltaRuleArgs& a);
void delta_rule_recurrent_items_avx512(const DeltaRuleArgs& a, int64_t i0, int64_t i1);

}  // namespace lineage::kernels
