// The batched forward against each sequence run alone: the harness shared by the preset tests
// beside the model code and the checkpoint tests here.
#pragma once

#include <cstdint>
#include <string>

#include "lineage/model/model.h"

namespace lineage::test {

// A preset's configuration at a tiny size (2 layers, width 64, heads of 32, vocabulary 300), with
// every switch of the preset kept, and seeded f32 weights.
model::Model tiny_preset(const std::string& name, uint64_t seed = 1);

// Runs B sequences of unequal lengths through one state pool, a step at a time: each sequence's
// prompt as a prefill piece, then one token a step, teacher-forced; sequences join in later steps
// (their prompts in the same step as the others' decode tokens) and leave when done, so later ones
// reuse released slots. Each sequence's logits at every position must equal those of the same
// sequence run alone within `tol` relative RMS (B = 1: bit for bit), and a second batched run must
// give the same bits. Returns the largest relative RMS seen.
double expect_batched_equals_alone(const model::Model& m, int B, double tol, uint64_t seed = 7);

// B ≤ 8 sequences prefilled alone, then decoding together, one token each a step: every step's
// logits bit for bit those of each sequence decoding alone, where the weights are [out, in] (a
// step of up to 8 rows runs each row through the lone GEMV's arithmetic; kernels::linear).
void expect_decode_together_bitwise(const model::Model& m, int B, uint64_t seed = 9);

}  // namespace lineage::test
