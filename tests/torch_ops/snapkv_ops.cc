// Exposes kernels/snapkv_select to pytest as torch.ops.snapserve.snapkv_select,
// snapkv_scores and snapkv_gather, so the C++ CPU and CUDA paths are checked against the
// independent Python reference (tests/python/reference/snapkv.py). The ops are
// registered without a dispatch key: the same checked, device-dispatching C++
// functions serve CPU and CUDA tensors.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string_view>
#include <tuple>
#include <utility>

#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace {

using snapserve::kernels::GroupReduce;
using snapserve::kernels::PoolingKind;
using snapserve::kernels::SnapKvParams;

PoolingKind parse_pooling(std::string_view s) {
  if (s == "max") return PoolingKind::kMax;
  if (s == "avg") return PoolingKind::kAvg;
  TORCH_CHECK(false, "pooling: expected 'max' or 'avg', got '", s, "'");
}

GroupReduce parse_group_reduce(std::string_view s) {
  if (s == "mean") return GroupReduce::kMean;
  if (s == "max") return GroupReduce::kMax;
  TORCH_CHECK(false, "group_reduce: expected 'mean' or 'max', got '", s, "'");
}

at::Tensor snapkv_select_op(const at::Tensor& q_window, const at::Tensor& keys, int64_t window,
                            int64_t capacity, int64_t kernel_size, std::string_view pooling,
                            std::string_view group_reduce) {
  const SnapKvParams params{window, capacity, kernel_size, parse_pooling(pooling),
                            parse_group_reduce(group_reduce)};
  return snapserve::kernels::snapkv_select(q_window, keys, params);
}

// (raw, pooled); capacity is not an argument since snapkv_scores ignores it.
std::tuple<at::Tensor, at::Tensor> snapkv_scores_op(const at::Tensor& q_window,
                                                    const at::Tensor& keys, int64_t window,
                                                    int64_t kernel_size, std::string_view pooling,
                                                    std::string_view group_reduce) {
  const SnapKvParams params{window, 0, kernel_size, parse_pooling(pooling),
                            parse_group_reduce(group_reduce)};
  snapserve::kernels::SnapKvScores scores =
      snapserve::kernels::snapkv_scores(q_window, keys, params);
  return {std::move(scores.raw), std::move(scores.pooled)};
}

at::Tensor snapkv_gather_op(const at::Tensor& src, const at::Tensor& indices) {
  return snapserve::kernels::snapkv_gather(src, indices);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "snapkv_select(Tensor q_window, Tensor keys, int window, int capacity, int kernel_size, "
      "str pooling, str group_reduce) -> Tensor",
      &snapkv_select_op);
  m.def(
      "snapkv_scores(Tensor q_window, Tensor keys, int window, int kernel_size, str pooling, "
      "str group_reduce) -> (Tensor, Tensor)",
      &snapkv_scores_op);
  m.def("snapkv_gather(Tensor src, Tensor indices) -> Tensor", &snapkv_gather_op);
}
