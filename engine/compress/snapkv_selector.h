// Applies a request's SnapKV policy to its KV cache: builds the per-sequence
// KvSelector that PagedKvCache calls right after each prefill layer's
// attention (docs/snapkv.md, step 9), so only one layer's full K/V is alive at a
// time. The scoring and selection are kernels/snapkv_select; this file only
// cuts the observation window out of the queries, times the work and records
// the retained attention of what was kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/compress/compression_policy.h"
#include "engine/kv/paged_kv_cache.h"

namespace snapserve::compress {

// Time spent selecting, summed over the layers of one request.
struct SelectionTimer {
  double seconds = 0;
};

// The share of the observation window's attention on the prompt prefix that
// falls on the positions a policy kept (docs/compression-policies.md,
// "Retained attention"), averaged over layers and KV heads. One per
// compressed request; its selector adds each layer, the engine reads the mean
// when the request ends. Engine thread only.
class RetainedAttention {
 public:
  // One layer:
  //   raw:  [num_kv_heads, n - w] float32, kernels::snapkv_scores' `raw`
  //   kept: [num_kv_heads, m] int64, the positions in [0, n) the layer keeps
  //         (distinct per row); window positions (>= n - w) are ignored
  // Adds, per KV head, sum(raw over kept prefix positions) / sum(raw) (1 when
  // the window gave the prefix no attention at all). No device sync: the sum
  // stays on the scores' device until Mean().
  void AddLayer(const at::Tensor& raw, const at::Tensor& kept);

  // The mean over every KV head of every layer added; -1 when none was.
  double Mean() const;

 private:
  at::Tensor sum_;  // float64 scalar: the per-head ratios added so far
  int64_t heads_ = 0;
};

// SnapKV's step 7 for a budget that may be the window alone: the positions
// kept per KV head [G, capacity] int64, increasing; snapkv_topk when
// capacity > window, else the window's positions.
at::Tensor KeepTopScores(const at::Tensor& pooled, const kernels::SnapKvParams& params);

// A selector keeping the SnapKV selection of `config` (which must apply to
// the prompt: ShouldCompress). `timer` and `retained` may be null; `retained`
// gets every layer, from the scores the selection ranked. With
// `layer_capacities` (PyramidKV: PyramidLayerBudgets) layer l keeps
// layer_capacities[l] entries per KV head instead of config.capacity.
kv::KvSelector MakeSnapKvSelector(const KvCompressionConfig& config,
                                  std::shared_ptr<SelectionTimer> timer,
                                  std::shared_ptr<RetainedAttention> retained = nullptr,
                                  std::vector<int64_t> layer_capacities = {});

}  // namespace snapserve::compress
