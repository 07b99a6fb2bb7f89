#include "engine/compress/snapkv_selector.h"

#include <ATen/ATen.h>

#include <chrono>

#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace snapserve::compress {

void RetainedAttention::AddLayer(const at::Tensor& raw, const at::Tensor& kept) {
  const int64_t prefix = raw.size(1);
  const at::Tensor scores = raw.to(at::kDouble);
  // Kept window positions are clamped onto a prefix column and then zeroed.
  const at::Tensor in_prefix = kept < prefix;
  const at::Tensor columns = kept.clamp_max(prefix - 1);
  const at::Tensor kept_mass = (scores.gather(1, columns) * in_prefix).sum(1);
  const at::Tensor total = scores.sum(1);
  // A window that gives the prefix no attention loses nothing by any choice.
  const at::Tensor ratio =
      at::where(total > 0, kept_mass / total.clamp_min(1e-300), at::ones_like(total));
  const at::Tensor layer_sum = ratio.sum();
  sum_ = sum_.defined() ? sum_ + layer_sum : layer_sum;
  heads_ += raw.size(0);
}

double RetainedAttention::Mean() const {
  if (heads_ == 0) return -1;
  return sum_.item<double>() / static_cast<double>(heads_);
}

at::Tensor KeepTopScores(const at::Tensor& pooled, const kernels::SnapKvParams& params) {
  const int64_t prefix = pooled.size(1);
  if (params.capacity > params.window) return kernels::snapkv_topk(pooled, params);
  // A budget of the window alone (PyramidKV's last layers may get it): no
  // prefix position is kept.
  return at::arange(prefix, prefix + params.window, pooled.options().dtype(at::kLong))
      .expand({pooled.size(0), -1})
      .contiguous();
}

kv::KvSelector MakeSnapKvSelector(const KvCompressionConfig& config,
                                  std::shared_ptr<SelectionTimer> timer,
                                  std::shared_ptr<RetainedAttention> retained,
                                  std::vector<int64_t> layer_capacities) {
  const kernels::SnapKvParams base = ToSnapKvParams(config);
  return [base, timer, retained, layer_capacities](int64_t layer, const at::Tensor& q,
                                                   const at::Tensor& k, const at::Tensor& v) {
    const auto start = std::chrono::steady_clock::now();
    kernels::SnapKvParams params = base;
    if (!layer_capacities.empty())
      params.capacity = layer_capacities.at(static_cast<size_t>(layer));
    // q [num_heads, r, d] holds the prompt's last r >= w queries (kv_store.h):
    // the observation window is its last w rows.
    const at::Tensor q_window = q.narrow(1, q.size(1) - params.window, params.window);
    // snapkv_select, in two steps so that the retained attention reads the
    // very scores that were ranked.
    const kernels::SnapKvScores scores = kernels::snapkv_scores(q_window, k, params);
    const at::Tensor keep = KeepTopScores(scores.pooled, params);  // [G, C]
    kv::KeptKv kept{kernels::snapkv_gather(k, keep), kernels::snapkv_gather(v, keep), {}};
    if (timer) {
      timer->seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (retained) retained->AddLayer(scores.raw, keep);  // telemetry, not selection time
    return kept;
  };
}

}  // namespace snapserve::compress
