// The result of kernels::snapkv_scores (contract in kernels/snapkv_select/snapkv_select.h).
// A header of its own because it holds tensors by value and so needs ATen,
// which kernels/snapkv_select/snapkv_select.h keeps out of the request path's includes.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/snapkv_select/snapkv_select.h"

namespace snapserve::kernels {

struct SnapKvScores {
  at::Tensor raw;     // [num_kv_heads, n - window] float32: steps 3-5, before pooling
  at::Tensor pooled;  // [num_kv_heads, n - window] float32: step 6, what top-k ranks
};

}  // namespace snapserve::kernels
