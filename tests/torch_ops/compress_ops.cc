// Exposes the engine's compression selectors that are not kernels to pytest:
// torch.ops.snapserve.streaming_llm_select runs the very KvSelector the
// server installs for a StreamingLLM request (engine/compress/
// streaming_llm_selector.h), so its kept positions can be compared with
// kvpress and with the Python reference.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>

#include "engine/compress/streaming_llm_selector.h"

namespace {

// k, v [num_kv_heads, n, head_dim] of one layer -> the kept (k, v).
std::tuple<at::Tensor, at::Tensor> streaming_llm_select_op(const at::Tensor& keys,
                                                           const at::Tensor& values,
                                                           int64_t capacity, int64_t sink_tokens) {
  snapserve::engine::KvCompressionConfig config;
  config.method = snapserve::engine::KvMethod::kStreamingLlm;
  config.capacity = capacity;
  config.sink_tokens = sink_tokens;
  const auto [k, v] = snapserve::compress::MakeStreamingLlmSelector(config)(
      /*layer=*/0, /*q=*/at::Tensor(), keys, values);
  return {k, v};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "streaming_llm_select(Tensor keys, Tensor values, int capacity, int sink_tokens) -> "
      "(Tensor, Tensor)",
      &streaming_llm_select_op);
}
