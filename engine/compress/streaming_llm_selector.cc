#include "engine/compress/streaming_llm_selector.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace snapserve::compress {

StreamingLlmSpan StreamingLlmKept(int64_t n, int64_t capacity, int64_t sink_tokens) {
  TORCH_CHECK(0 <= sink_tokens && sink_tokens < capacity && capacity < n,
              "StreamingLLM: needs 0 <= sink < C < n, got sink ", sink_tokens, ", C ", capacity,
              ", n ", n);
  return {sink_tokens, n - (capacity - sink_tokens)};
}

int64_t StreamingLlmScoreWindow(const KvCompressionConfig& config, int64_t n) {
  return config.window >= 1 && config.window < n ? config.window : 0;
}

namespace {

// The retained attention of one layer's StreamingLLM selection. Only `raw` is
// read, which pooling does not touch: kernel_size 1 skips the pooling pass (and
// the config's kernel, unvalidated for StreamingLLM, cannot fail the call).
void AddRetained(RetainedAttention& retained, const KvCompressionConfig& config,
                 const StreamingLlmSpan& span, const at::Tensor& q, const at::Tensor& k) {
  const int64_t n = k.size(1);
  const int64_t w = StreamingLlmScoreWindow(config, n);
  if (w == 0 || q.size(1) < w) return;
  const kernels::SnapKvParams params{w, config.capacity, 1, kernels::PoolingKind::kMax,
                                     config.group_reduce};
  const kernels::SnapKvScores scores =
      kernels::snapkv_scores(q.narrow(1, q.size(1) - w, w), k, params);
  const auto options = k.options().dtype(at::kLong);
  const at::Tensor kept =
      at::cat({at::arange(0, span.sink, options), at::arange(span.recent_begin, n, options)})
          .expand({k.size(0), -1})
          .contiguous();
  retained.AddLayer(scores.raw, kept);
}

}  // namespace

kv::KvSelector MakeStreamingLlmSelector(const KvCompressionConfig& config,
                                        std::shared_ptr<RetainedAttention> retained) {
  return [config, retained](int64_t /*layer*/, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    // k, v [G, n, d]: the same two spans for every KV head and layer, so two
    // slices and one concatenation instead of a per-head gather.
    const StreamingLlmSpan span = StreamingLlmKept(k.size(1), config.capacity, config.sink_tokens);
    const int64_t recent = k.size(1) - span.recent_begin;
    auto keep = [&](const at::Tensor& t) {
      return at::cat({t.narrow(1, 0, span.sink), t.narrow(1, span.recent_begin, recent)}, 1);
    };
    if (retained && q.defined()) AddRetained(*retained, config, span, q, k);
    return kv::KeptKv{keep(k), keep(v), {}};
  };
}

}  // namespace snapserve::compress
