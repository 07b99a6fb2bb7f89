// Exposes the engine's compression selectors that are not kernels to pytest:
// torch.ops.snapserve.streaming_llm_select runs the very KvSelector the
// server installs for a StreamingLLM request (engine/compress/
// streaming_llm_selector.h), adakv_select AdaKV's selection from SnapKV's
// scores (adakv_selector.h) and pyramid_layer_budgets PyramidKV's budgets
// (compression_policy.h), so what they keep can be compared with kvpress and with
// the Python references.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>

#include <string_view>
#include <vector>

#include "engine/compress/adakv_selector.h"
#include "engine/compress/compression_policy.h"
#include "engine/compress/streaming_llm_selector.h"
#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace {

// k, v [num_kv_heads, n, head_dim] of one layer -> the kept (k, v).
std::tuple<at::Tensor, at::Tensor> streaming_llm_select_op(const at::Tensor& keys,
                                                           const at::Tensor& values,
                                                           int64_t capacity, int64_t sink_tokens) {
  snapserve::engine::KvCompressionConfig config;
  config.method = snapserve::engine::KvMethod::kStreamingLlm;
  config.capacity = capacity;
  config.sink_tokens = sink_tokens;
  const snapserve::kv::KeptKv kept = snapserve::compress::MakeStreamingLlmSelector(config)(
      /*layer=*/0, /*q=*/at::Tensor(), keys, values);
  return {kept.k, kept.v};
}

// One layer's AdaKV selection as the server makes it: positions [G, m]
// (padded) and the count each head keeps [G].
std::tuple<at::Tensor, at::Tensor> adakv_select_op(const at::Tensor& q_window,
                                                   const at::Tensor& keys, int64_t capacity,
                                                   int64_t kernel_size, std::string_view pooling,
                                                   double alpha) {
  snapserve::engine::KvCompressionConfig config;
  config.method = snapserve::engine::KvMethod::kAdaKv;
  config.window = q_window.size(1);
  config.capacity = capacity;
  config.kernel_size = kernel_size;
  TORCH_CHECK(pooling == "max" || pooling == "avg", "pooling: 'max' or 'avg'");
  config.pooling = pooling == "max" ? snapserve::kernels::PoolingKind::kMax
                                    : snapserve::kernels::PoolingKind::kAvg;
  config.adakv_alpha = alpha;
  const snapserve::kernels::SnapKvScores scores = snapserve::kernels::snapkv_scores(
      q_window, keys, snapserve::compress::ToSnapKvParams(config));
  snapserve::compress::AdaKvSelection s = snapserve::compress::AdaKvSelect(
      scores.pooled, config.window, capacity, snapserve::compress::AdaKvHeadFloor(config));
  return {s.positions, at::tensor(s.lengths, at::kLong)};
}

std::vector<int64_t> pyramid_layer_budgets_op(int64_t n, int64_t num_layers, int64_t capacity,
                                              int64_t window, int64_t beta) {
  snapserve::engine::KvCompressionConfig config;
  config.method = snapserve::engine::KvMethod::kPyramidKv;
  config.capacity = capacity;
  config.window = window;
  config.pyramid_beta = beta;
  return snapserve::compress::PyramidLayerBudgets(config, n, num_layers);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "streaming_llm_select(Tensor keys, Tensor values, int capacity, int sink_tokens) -> "
      "(Tensor, Tensor)",
      &streaming_llm_select_op);
  m.def(
      "adakv_select(Tensor q_window, Tensor keys, int capacity, int kernel_size, str pooling, "
      "float alpha) -> (Tensor, Tensor)",
      &adakv_select_op);
  m.def("pyramid_layer_budgets(int n, int num_layers, int capacity, int window, int beta) -> int[]",
        &pyramid_layer_budgets_op);
}
