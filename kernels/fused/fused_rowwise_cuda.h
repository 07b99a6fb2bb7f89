// Raw-pointer launchers of the decoder layer's row-wise steps on CUDA, each
// one kernel where the LibTorch expressions take several launches: the
// residual add fused with RMSNorm, RoPE on q and k in place, and the SwiGLU
// gate (kernels/fused/fused_cuda.cc checks tensors and calls these). No LibTorch
// type crosses this header. Every launcher only enqueues on `stream`, never
// synchronizes, and returns the launch error, if any. Arithmetic is float32
// whatever the element type T (FloatType); 16-bit results are rounded once,
// to nearest even, where the formula below says T(...).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/paged_attention/paged_attention_cuda.h"  // FloatType

namespace snapserve::kernels::cuda {

// For each row: x = residual + delta (float32; written back to residual when
// delta is given), then out = T(weight * T(x * (1 / sqrt(mean(x^2) + eps)))):
// transformers' LlamaRMSNorm in dtype T, the model's residual stream in
// float32 (engine/model/llama_model.cc, RmsNorm and AddLinear).
cudaError_t launch_rms_norm_add(FloatType type,
                                float* residual,    // [rows, n] float32, row stride residual_stride
                                const void* delta,  // [rows, n] T, row stride delta_stride, or null
                                const void* weight,  // [n] T
                                void* out,           // [rows, n] T, contiguous
                                int64_t rows, int64_t n, int64_t residual_stride,
                                int64_t delta_stride, float eps, cudaStream_t stream);

// The largest head_dim launch_rope_qk takes (its cos/sin live in shared memory).
inline constexpr int kRopeMaxHeadDim = 512;

// Rotates heads in place: with f_i = float(positions[t]) * inv_freq[i] (one
// float32 product, as transformers' RoPE computes it), c = cos f_i and
// s = sin f_i in float32, each pair (x_i, x_{i + d/2}) of a head becomes
// (T(x_i c - x_{i+d/2} s), T(x_{i+d/2} c + x_i s)) ("rotate half" layout,
// engine/model/rope.h). The q and k heads of a qkv product are one call:
// heads = H + G, token_stride = (H + 2G) * d.
cudaError_t launch_rope_qk(FloatType type,
                           void* x,  // [tokens, heads, head_dim] T, strides (token_stride,
                                     //  head_stride, 1) in elements
                           const int64_t* positions,  // [tokens]
                           const float* inv_freq,     // [head_dim / 2]
                           int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                           int64_t head_stride, cudaStream_t stream);

// out = T(silu(gate) * up) with silu(g) = g / (1 + exp(-g)) (kernels/rowwise/rowwise.h).
cudaError_t launch_silu_mul(FloatType type,
                            void* out,            // [rows, inter] T, contiguous
                            const void* gate_up,  // [rows, 2 * inter] T, row stride gate_up_stride,
                                                  //  gate columns first
                            int64_t rows, int64_t inter, int64_t gate_up_stride,
                            cudaStream_t stream);

}  // namespace snapserve::kernels::cuda
