#include "engine/compress/keydiff_selector.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace snapserve::compress {

at::Tensor KeyDiffScores(const at::Tensor& k) {
  TORCH_CHECK(k.dim() == 3, "KeyDiff: keys must be [G, n, d], got ", k.sizes());
  // Scored in float32 whatever the cache's dtype, so a bfloat16 cache ranks
  // the same way kvpress ranks a float32 model's keys. The same ATen
  // operations as torch.nn.functional.normalize and cosine_similarity, with
  // their default eps, keep near-ties ordered as the reference orders them.
  const at::Tensor keys = k.to(at::kFloat);
  const at::Tensor unit = keys / keys.norm(2, /*dim=*/-1, /*keepdim=*/true).clamp_min(1e-12);
  const at::Tensor anchor = unit.mean(/*dim=*/1, /*keepdim=*/true);  // [G, 1, d]
  return at::cosine_similarity(keys, anchor, /*dim=*/-1, /*eps=*/1e-8).neg();
}

at::Tensor KeyDiffKept(const at::Tensor& k, int64_t capacity) {
  TORCH_CHECK(1 <= capacity && capacity <= k.size(1), "KeyDiff: needs 1 <= C <= n, got C ",
              capacity, ", n ", k.size(1));
  const at::Tensor top = std::get<1>(KeyDiffScores(k).topk(capacity, /*dim=*/-1));
  // Increasing positions: the cache keeps a head's entries in prompt order.
  return std::get<0>(top.sort(/*dim=*/-1));
}

int64_t KeyDiffScoreWindow(const KvCompressionConfig& config, int64_t n) {
  return config.window >= 1 && config.window < n ? config.window : 0;
}

namespace {

// The retained attention of one layer's KeyDiff selection. Only `raw` is
// read, which pooling does not touch: kernel_size 1 skips the pooling pass.
void AddRetained(RetainedAttention& retained, const KvCompressionConfig& config,
                 const at::Tensor& kept, const at::Tensor& q, const at::Tensor& k) {
  const int64_t w = KeyDiffScoreWindow(config, k.size(1));
  if (w == 0 || q.size(1) < w) return;
  const kernels::SnapKvParams params{w, config.capacity, 1, kernels::PoolingKind::kMax,
                                     config.group_reduce};
  const kernels::SnapKvScores scores =
      kernels::snapkv_scores(q.narrow(1, q.size(1) - w, w), k, params);
  retained.AddLayer(scores.raw, kept);
}

}  // namespace

kv::KvSelector MakeKeyDiffSelector(const KvCompressionConfig& config,
                                   std::shared_ptr<RetainedAttention> retained) {
  return [config, retained](int64_t /*layer*/, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    // k, v [G, n, d]: each KV head keeps its own C rows.
    const at::Tensor kept = KeyDiffKept(k, config.capacity);
    const at::Tensor rows = kept.unsqueeze(-1);
    if (retained && q.defined()) AddRetained(*retained, config, kept, q, k);
    return kv::KeptKv{k.gather(1, rows.expand({-1, -1, k.size(2)})),
                      v.gather(1, rows.expand({-1, -1, v.size(2)})),
                      {}};
  };
}

}  // namespace snapserve::compress
