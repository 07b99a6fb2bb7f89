#include "engine/compress/adakv_selector.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace snapserve::compress {

AdaKvSelection AdaKvSelect(const at::Tensor& pooled, int64_t window, int64_t capacity,
                           int64_t head_floor) {
  TORCH_CHECK(pooled.dim() == 2, "AdaKV: scores must be [G, n - w], got ", pooled.sizes());
  const int64_t heads = pooled.size(0);
  const int64_t prefix = pooled.size(1);
  TORCH_CHECK(window >= 1 && window < capacity && capacity < prefix + window,
              "AdaKV: needs 1 <= w < C < n, got w ", window, ", C ", capacity, ", n ",
              prefix + window);
  const int64_t per_head = capacity - window;  // prefix entries per head on average
  const int64_t floor_prefix = std::clamp<int64_t>(head_floor - window, 0, per_head);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // NaN ranks below every number; -inf keeps that order through the sorts.
  at::Tensor scores = at::nan_to_num(pooled.to(at::kFloat), -kInf, kInf, -kInf).contiguous();
  if (floor_prefix > 0) {
    // The safeguard: each head's own best positions are kept whatever the
    // other heads score (a stable descending sort puts the lower position
    // first among equals).
    const at::Tensor best = std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/1,
                                                 /*descending=*/true))
                                .narrow(1, 0, floor_prefix);
    scores.scatter_(1, best, kInf);
  }
  // The whole layer's prefix budget, best first; the flat index h * P + j
  // breaks ties to the lower head, then the lower position.
  const at::Tensor order = std::get<1>(at::sort(scores.reshape({-1}), /*stable=*/true, /*dim=*/0,
                                                /*descending=*/true))
                               .narrow(0, 0, heads * per_head)
                               .to(at::kCPU);
  std::vector<std::vector<int64_t>> kept(static_cast<size_t>(heads));
  const int64_t* flat = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < order.numel(); ++i)
    kept[static_cast<size_t>(flat[i] / prefix)].push_back(flat[i] % prefix);
  AdaKvSelection out;
  int64_t widest = 0;
  for (auto& row : kept) {
    std::sort(row.begin(), row.end());
    for (int64_t j = prefix; j < prefix + window; ++j) row.push_back(j);  // the window
    out.lengths.push_back(static_cast<int64_t>(row.size()));
    widest = std::max<int64_t>(widest, static_cast<int64_t>(row.size()));
  }
  const int64_t last = prefix + window - 1;
  std::vector<int64_t> padded(static_cast<size_t>(heads * widest), last);
  for (int64_t g = 0; g < heads; ++g) {
    const auto& row = kept[static_cast<size_t>(g)];
    std::copy(row.begin(), row.end(), padded.begin() + static_cast<std::ptrdiff_t>(g * widest));
  }
  out.positions =
      at::from_blob(padded.data(), {heads, widest}, at::kLong).clone().to(pooled.device());
  return out;
}

kv::KvSelector MakeAdaKvSelector(const KvCompressionConfig& config,
                                 std::shared_ptr<SelectionTimer> timer,
                                 std::shared_ptr<RetainedAttention> retained) {
  const kernels::SnapKvParams params = ToSnapKvParams(config);
  const int64_t head_floor = AdaKvHeadFloor(config);
  return [params, head_floor, timer, retained](int64_t /*layer*/, const at::Tensor& q,
                                               const at::Tensor& k, const at::Tensor& v) {
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor q_window = q.narrow(1, q.size(1) - params.window, params.window);
    const kernels::SnapKvScores scores = kernels::snapkv_scores(q_window, k, params);
    AdaKvSelection keep = AdaKvSelect(scores.pooled, params.window, params.capacity, head_floor);
    kv::KeptKv kept{kernels::snapkv_gather(k, keep.positions),
                    kernels::snapkv_gather(v, keep.positions), std::move(keep.lengths)};
    if (timer) {
      timer->seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    // Padding repeats the last (window) position, which the figure ignores.
    if (retained) retained->AddLayer(scores.raw, keep.positions);
    return kept;
  };
}

}  // namespace snapserve::compress
