// The model's CPU linear layer: y = x · wᵀ with float32 activations and
// float32, bfloat16 or GGUF-quantized weights (quant_matrix.h), accumulated
// in float32.
//
// - bfloat16 weights are how a bfloat16 model runs on CPU
//   (engine/model/llama_model.h): half the memory and bandwidth of float32.
//   By default activations are never rounded to 8 mantissa bits; under
//   DecodeDot::kBFloat16 (kernels/linear/decode_dot.h) decode-sized batches round
//   them and take bfloat16 dot products.
// - Decode-sized inputs (m <= kLinearSmallRows rows) take a fixed-order kernel:
//   each output element is one dot product over K in a fixed order, whatever m
//   is, so a sequence's logits do not depend on what else is in the batch
//   (docs/kv-cache-and-scheduling.md, "Batching invariance"), and weights
//   stream from memory once per call at close to the machine's read bandwidth
//   (decode is bandwidth bound).
// - Larger m (prompt prefill) uses LibTorch's GEMM; bfloat16 weights and
//   quantized weights are decoded for it in cache-sized slices. Those rows
//   come from another reduction order, which is fine: prefill never mixes
//   sequences. PrefillGemm picks that GEMM's precision.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/linear/decode_dot.h"
#include "kernels/prefill_gemm/prefill_gemm.h"
#include "kernels/quant/quant_matrix.h"

namespace snapserve::kernels {

// Rows of x at or below this count take the fixed-order kernel.
inline constexpr int64_t kLinearSmallRows = 64;

// x  [m, K] float32, CPU
// w  [N, K] float32 or bfloat16, CPU, contiguous (the nn.Linear weight layout)
// returns [m, N] float32. `dot` applies to bfloat16 weights at decode-sized m.
at::Tensor linear_float32(const at::Tensor& x, const at::Tensor& w,
                          PrefillGemm gemm = PrefillGemm::kFloat32,
                          DecodeDot dot = DecodeDot::kFloat32);

// The bfloat16 GEMM of linear_float32 (PrefillGemm::kBFloat16, a bfloat16 w
// [N, K], prompt-sized x [M, K] float32) with its product left in bfloat16:
// linear_float32 returns exactly this, widened. For a consumer that widens
// as it reads (silu_mul), so that a large product's float32 copy is never
// written (docs/quantized-weights.md, "The bfloat16 prompt GEMM").
at::Tensor linear_bf16_gemm(const at::Tensor& x, const at::Tensor& w);

// How decode-sized m multiplies GGUF blocks: QuantDot (quant_blocks.h).
// Prompt-sized m decodes slices for the GEMM `gemm` picks.
// The same with w [N, K] kept in GGUF blocks.
at::Tensor linear_quantized(const at::Tensor& x, const QuantMatrix& w,
                            QuantDot dot = QuantDot::kExact,
                            PrefillGemm gemm = PrefillGemm::kFloat32);

namespace cpu {
// Where the fixed-order kernel reads weight row r as float32: in place
// (f32), or widened/decoded into a caller's scratch row (bf16, quant).
struct WeightRows {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  const QuantMatrix* quant = nullptr;
  int64_t k = 0;

  bool in_place() const { return f32 != nullptr; }
  const float* row(int64_t r, float* scratch) const;
};

// Fixed-order kernel; x [m, K] contiguous, `n` weight rows, out [m, n] contiguous float32.
void linear_rows_small(const at::Tensor& x, const WeightRows& w, int64_t n, at::Tensor& out);

// The same under DecodeDot::kBFloat16 with AVX512_BF16 (has_avx512_bf16()):
// x [m, K] float32 is rounded to bfloat16, w [n, K] is bfloat16 bits.
void linear_rows_small_bf16_dot(const at::Tensor& x, const uint16_t* w, int64_t n, at::Tensor& out);
}  // namespace cpu

}  // namespace snapserve::kernels
