// AdaKV (arXiv 2407.11550) applied to a prompt: SnapKV's scores, but each
// layer's budget of C entries per KV head is pooled over its KV heads and
// handed to the highest scores of the whole layer, so a head whose attention
// is focused keeps fewer entries and a diffuse one more. Every head keeps its
// observation window and at least a floor of its own best positions (the
// paper's safeguard). The exact rule, ties and rounding:
// docs/compression-policies.md, "AdaKV".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/compress/compression_policy.h"
#include "engine/compress/snapkv_selector.h"
#include "engine/kv/paged_kv_cache.h"

namespace snapserve::compress {

// What one layer keeps: positions [G, m] int64, row g = head g's kept
// positions in increasing order (its observation window last), padded past
// lengths[g] with the prompt's last position; lengths sum to G * C.
struct AdaKvSelection {
  at::Tensor positions;
  std::vector<int64_t> lengths;
};

// The selection from SnapKV's pooled scores [G, n - w] (float32, any device):
// each head first keeps its head_floor - w best prefix positions (head_floor
// from AdaKvHeadFloor), then the rest of the layer's G * (C - w) prefix
// budget goes to the best remaining (head, position) pairs of the layer.
// Ranking: score descending, NaN below every number, ties to the lower head
// then the lower position. Needs w < C < n.
AdaKvSelection AdaKvSelect(const at::Tensor& pooled, int64_t window, int64_t capacity,
                           int64_t head_floor);

// A selector keeping AdaKV's selection for `config` (method AdaKV, applied to
// the prompt: ShouldCompress). `timer` and `retained` may be null.
kv::KvSelector MakeAdaKvSelector(const KvCompressionConfig& config,
                                 std::shared_ptr<SelectionTimer> timer,
                                 std::shared_ptr<RetainedAttention> retained = nullptr);

}  // namespace snapserve::compress
