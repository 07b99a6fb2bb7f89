// The model's CPU linear layer: y = x · wᵀ with float32 activations and
// float32 or bfloat16 weights, accumulated in float32.
//
// - bfloat16 weights are how a bfloat16 model runs on CPU
//   (engine/model/llama_model.h): half the memory and bandwidth of float32,
//   while activations are never rounded to 8 mantissa bits.
// - Decode-sized inputs (m <= kLinearSmallRows rows) take a fixed-order kernel:
//   each output element is one dot product over K in a fixed order, whatever m
//   is, so a sequence's logits do not depend on what else is in the batch
//   (docs/kv-cache-and-scheduling.md, "Batching invariance"), and weights
//   stream from memory once per call at close to the machine's read bandwidth
//   (decode is bandwidth bound).
// - Larger m (prompt prefill) uses LibTorch's float32 GEMM; bfloat16 weights
//   are widened for it in cache-sized slices. Those rows come from another
//   reduction order, which is fine: prefill never mixes sequences.
#pragma once

#include <ATen/core/Tensor.h>

namespace snapserve::kernels {

// Rows of x at or below this count take the fixed-order kernel.
inline constexpr int64_t kLinearSmallRows = 64;

// x  [m, K] float32, CPU
// w  [N, K] float32 or bfloat16, CPU, contiguous (the nn.Linear weight layout)
// returns [m, N] float32
at::Tensor linear_float32(const at::Tensor& x, const at::Tensor& w);

namespace cpu {
// Fixed-order kernel; x [m, K] and w [N, K] contiguous, out [m, N] contiguous float32.
void linear_float32_small(const at::Tensor& x, const at::Tensor& w, at::Tensor& out);
}  // namespace cpu

}  // namespace snapserve::kernels
