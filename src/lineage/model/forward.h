// One step through the model, and readying its weights for it once.
#pragma once

#include <cstdint>

#include "lineage/layers/common.h"
#include "lineage/layers/step.h"
#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"

namespace lineage::model {

// Which rows of logits forward() writes.
enum class LogitRows : uint8_t { All, Last, None };

// Runs one step through the model: the step's sequences continue from their pool slots (each at
// its slot's position, which must equal the step's start for it) and leave them as if each
// sequence's tokens had been fed one at a time, alone. logits: [N, V] (All), [B, V] with the last
// token of each sequence (Last), or unused (None). Throws Error when a sequence would exceed the
// model's context limit or the pool's ctx, a token id is outside the vocabulary, or a slot is not
// acquired, appears twice, or starts elsewhere than its position. `options` defaults to the model's.
void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace = {});
void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace, const layers::Options& options);

// Readies bound weights for forward, once: small parameters widened to f32 (each layer's
// prepare()), and with `owned` (presets, `--no-mmap`) GPT-2's Conv1D matrices, stored [in, out] in
// checkpoints, transposed to [out, in], where the decode GEMV reads each output's weights as one
// contiguous run (the [in, out] walk over 16-bit weights reads ~20 % slower per byte on the
// development CPU). Prefill gives the same bits either way (the GEMM packs both layouts into the
// same panels); one decoded token may differ in the last bits (another summation order). Mapped
// weights stay as the files hold them.
void prepare(Model& m, bool owned);

}  // namespace lineage::model
