// Tensor-level entry points of the fused CUDA kernels for the decoder layer
// (fused_rowwise_cuda.h, kv_append_lanes_cuda.h, split_decode_attention_cuda.h
// state the arithmetic): each checks its tensors, then enqueues one kernel (the
// split attention two) on the current CUDA stream without synchronizing.
// CUDA tensors only; in a build without CUDA every call throws. Outputs are
// caller-provided where a step writes into a buffer it reuses (decode steps,
// CUDA graphs), and checked, never resized.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace snapserve::kernels {

// Whether the engine's CUDA forward (LlamaModel, PagedKvCache) calls these
// kernels: true in a CUDA build unless the environment sets
// SNAPSERVE_CUDA_FUSED=0, which keeps the LibTorch expressions and the first
// attention kernel they replace (to time or check one against the other).
// Read once per process.
bool cuda_fused_enabled();

// residual [rows, n] float32 (any row stride), updated to residual + delta
// when delta is defined; delta [rows, n] and weight [n] of the output's dtype;
// out [rows, n] float32/bfloat16/float16, contiguous:
// out = T(weight * T(x * (1 / sqrt(mean(x^2) + eps)))) for x the updated row.
void rms_norm_add_cuda_(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                        double eps, at::Tensor& out);

// x [tokens, heads, head_dim] (any token and head strides, last dim
// contiguous), rotated in place for positions [tokens] int64 with inv_freq
// [head_dim / 2] float32 (engine/model/rope.h's RopeInvFreq).
void rope_qk_cuda_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq);

// gate_up [rows, 2 * inter] (any row stride, gate columns first) -> out
// [rows, inter] contiguous, the same dtype: silu(gate) * up.
void silu_mul_cuda_out(const at::Tensor& gate_up, at::Tensor& out);

// The paged cache's lanes (engine/kv/paged_kv_cache.h): key_cache and
// value_cache [num_blocks, 1, block_size, head_dim] contiguous; k, v
// [tokens, lanes, head_dim] of the cache's dtype with equal strides (last dim
// contiguous); slots [tokens, lanes] int64: row (t, g) goes to lane slot
// slots[t][g], negative skips it. Slots are trusted (no device read-back).
void kv_append_lanes_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& slots);

// Whether split_decode_attention_cuda takes these shapes and pointers
// (head_dim a multiple of 16 up to 256, 16-byte aligned contiguous tensors);
// kernels::paged_decode_attention serves the others.
bool split_decode_attention_supported(const at::Tensor& q, const at::Tensor& key_cache,
                                      const at::Tensor& value_cache);

// kernels::paged_decode_attention's contract (kernels/paged_attention/paged_attention.h) on
// CUDA, context split into partitions read in parallel, written into out
// [batch, num_heads, head_dim] (q's dtype, contiguous). A context length of 0
// gives zeros. partition_size 0 lets the plan choose, else a power of two
// in [64, 512]. Returns the number of partitions the launch used per sequence
// (1: no merge pass).
int64_t split_decode_attention_cuda(at::Tensor& out, const at::Tensor& q,
                                    const at::Tensor& key_cache, const at::Tensor& value_cache,
                                    const at::Tensor& block_tables, const at::Tensor& context_lens,
                                    double scale, int64_t partition_size = 0);

}  // namespace snapserve::kernels
