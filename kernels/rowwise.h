// The decoder layer's row-wise steps on CPU float32, one call each instead of
// the 4-8 LibTorch ops apiece they take when written as tensor expressions:
// RMSNorm, rotary embedding (in place) and the SwiGLU gate. At batch 1 a
// decode step of the default model runs ~100 such steps on 576-float rows, and
// the per-op dispatch and allocation cost more than the arithmetic
// (docs/quantized-weights.md, "Where a batch-1 decode step goes").
//
// Every row is computed alone, in one fixed order, whatever the row count, so
// results do not depend on what else is in the batch (docs/kv-cache-and-scheduling.md,
// "Batching invariance"). Formulas are transformers' (LlamaRMSNorm,
// apply_rotary_pos_emb, LlamaMLP's act_fn(gate) * up); the tests compare each
// with the LibTorch expression it replaces.
#pragma once

#include <ATen/core/Tensor.h>

namespace snapserve::kernels {

// x [m, n] float32, weight [n] float32 (CPU): weight * (x * rsqrt(mean(x^2) + eps)),
// the mean of squares summed in double. Returns a new [m, n] float32 tensor.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x [m, heads, d] float32 with a contiguous last dimension (e.g. the q and k
// heads of a fused qkv output), cos/sin [m, d] float32 contiguous: rotates x
// in place, x * cos + rotate_half(x) * sin with rotate_half pairing i and
// i + d/2. Multiplies and adds round as the tensor expression does, so the
// result is bit for bit LibTorch's.
void rope_rotate_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// gate_up [m, 2 * inter] float32 contiguous (gate columns first): returns
// silu(gate) * up as a new [m, inter] float32 tensor.
at::Tensor silu_mul(const at::Tensor& gate_up);

namespace cpu {
// out[i] = silu(gate[i]) * up[i] for i < n, eight at a time with
// simd::exp_avx2 (within 1 ulp of expf); returns false where the CPU path is
// portable (rowwise_cpu_avx2.cc).
bool silu_mul_row_avx2(const float* gate, const float* up, int64_t n, float* out);
}  // namespace cpu

}  // namespace snapserve::kernels
