#include "lineage/model/residual.h"

#include <cstring>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/model/model.h"

namespace lineage::model {


ResidualStream::ResidualStream(const Model& m, float* x, int64_t N, Workspace& ws)
    : m_(m), x_(x), n_(N), d_(m.config.d_model), ar_(&ws.attn_res) {
  if (m.config.residual == ResidualKind::BlockAttention)
    LINEAGE_CHECK(m.config.attn_res_block > 0 && m.output_res.defined(), "Block Attention Residuals without a block size");
}

// The mix of [finished blocks, partial] under query q, into the workspace.
const float* ResidualStream::mixed(const layers::AttnRes& q, const char* name, const layers::Trace& trace) {
  ar_->sources.clear();
  for (int64_t j = 0; j < blocks_; ++j) ar_->sources.push_back(ar_->blocks[size_t(j)].get(0));
  ar_->sources.push_back(x_);
  const int64_t S = int64_t(ar_->sources.size());
  float* out = ar_->mixed.get(size_t(n_ * d_));
  float* w = ar_->weights.get(size_t(n_ * S));
  layers::mix(q, ar_->sources, n_, out, w);
  trace(name, w, {n_, S});
  return out;
}

const float* ResidualStream::input(int64_t sublayer, const layers::Trace& trace) {
  if (m_.config.residual == ResidualKind::Plain) return x_;
  const Block& b = m_.blocks[size_t(sublayer / 2)];
  const float* in = !blocks_ ? x_
                    : sublayer % 2 ? mixed(b.mlp_res, "mlp_res.weights", trace)
                                   : mixed(b.attn_res, "attn_res.weights", trace);
  if (sublayer % m_.config.attn_res_block == 0) {  // the partial becomes a finished block
    if (ar_->blocks.size() <= size_t(blocks_)) ar_->blocks.resize(size_t(blocks_ + 1));
    float* dst = ar_->blocks[size_t(blocks_)].get(size_t(n_ * d_));
    std::memcpy(dst, x_, size_t(n_ * d_) * sizeof(float));
    ++blocks_;
    empty_ = true;
    if (in == x_) in = dst;  // x is overwritten by the next output
  }
  return in;
}

// x += y over n elements (x = y when a new block starts), split over the threads for long prompts.
void ResidualStream::add(int64_t, const float* y) {
  float* x = x_;
  const bool start = empty_;
  empty_ = false;
  parallel_for(n_ * d_, [&](int64_t i0, int64_t i1) {
    if (start) std::memcpy(x + i0, y + i0, size_t(i1 - i0) * sizeof(float));
    else
      for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  }, grain_for(1));
}

const float* ResidualStream::output(const layers::Trace& trace) {
  if (m_.config.residual == ResidualKind::Plain) return x_;
  return mixed(m_.output_res, "output_res.weights", trace);
}

}  // namespace lineage::model
