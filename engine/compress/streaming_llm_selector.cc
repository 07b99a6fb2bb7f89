#include "engine/compress/streaming_llm_selector.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace snapserve::compress {

StreamingLlmSpan StreamingLlmKept(int64_t n, int64_t capacity, int64_t sink_tokens) {
  TORCH_CHECK(0 <= sink_tokens && sink_tokens < capacity && capacity < n,
              "StreamingLLM: needs 0 <= sink < C < n, got sink ", sink_tokens, ", C ", capacity,
              ", n ", n);
  return {sink_tokens, n - (capacity - sink_tokens)};
}

kv::KvSelector MakeStreamingLlmSelector(const KvCompressionConfig& config) {
  const int64_t capacity = config.capacity;
  const int64_t sink_tokens = config.sink_tokens;
  return [capacity, sink_tokens](int64_t /*layer*/, const at::Tensor& /*q*/, const at::Tensor& k,
                                 const at::Tensor& v) {
    // k, v [G, n, d]: the same two spans for every KV head and layer, so two
    // slices and one concatenation instead of a per-head gather.
    const StreamingLlmSpan span = StreamingLlmKept(k.size(1), capacity, sink_tokens);
    const int64_t recent = k.size(1) - span.recent_begin;
    auto keep = [&](const at::Tensor& t) {
      return at::cat({t.narrow(1, 0, span.sink), t.narrow(1, span.recent_begin, recent)}, 1);
    };
    return std::pair<at::Tensor, at::Tensor>{keep(k), keep(v)};
  };
}

}  // namespace snapserve::compress
