// KV append: scatters new K/V entries into the paged cache at slots chosen by
// the caller (engine/kv computes them from block tables). Used after prefill
// (the entries SnapKV kept) and at every decode step (one entry per sequence).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace snapserve::kernels {

// key_cache, value_cache [num_blocks, G, block_size, d], contiguous; written in place
// k, v                   [T, G, d], same device as the caches (on CPU any token and
//                        head strides, each row's d values contiguous); the caches' dtype, or
//                        float32 into a 16-bit cache on CPU (rounded as Tensor::to
//                        rounds: to nearest, ties to even), which saves a decode step
//                        two conversions per layer
// slot_mapping           [T] int64: token i goes to block slot_mapping[i] / block_size
//                        at offset slot_mapping[i] % block_size; a negative slot skips
//                        token i (padding). Slots must be distinct.
// On CPU slots past the cache are an error; on CUDA they are trusted (no sync).
void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping);

// The int8 cache (--kv-cache-dtype=int8, CPU): each row of d values is kept
// as int8 in groups of kKvInt8Group, with one float32 scale per group:
//   s = max |x_j| / 127 over the group, q_j = round_half_even(x_j · (1 / s)),
// clamped to [-127, 127] (s = 0 and q = 0 for an all-zero group); a value
// reads back as float(q_j) · s. Why these groups: keys lose the most to int8,
// and 16 channels per scale keep the default model's next-token choices
// within 1 % of a bfloat16 cache's (bench/low_precision_study.py,
// docs/kv-cache-and-scheduling.md "int8 KV cache").
// key_cache, value_cache   int8 [num_blocks, G, block_size, d], d a multiple of 16
// key_scales, value_scales float32 [num_blocks, G, block_size, d / 16]
// k, v                     float32 [T, G, d] (any token and head strides, rows
//                          contiguous); slot_mapping as for kv_append.
inline constexpr int64_t kKvInt8Group = 16;
void kv_append_int8(at::Tensor& key_cache, at::Tensor& key_scales, at::Tensor& value_cache,
                    at::Tensor& value_scales, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& slot_mapping);

namespace cpu {
// Same contract; inputs already checked and on CPU, k/v rows contiguous.
void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping);
void kv_append_int8(at::Tensor& key_cache, at::Tensor& key_scales, at::Tensor& value_cache,
                    at::Tensor& value_scales, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& slot_mapping);
// One row of d values (a multiple of 16) into q [d] and scales [d / 16], as
// kv_append_int8 states; the AVX-512 version gives the same bits and returns
// false where it cannot run.
void quantize_kv_row(const float* x, int64_t d, int8_t* q, float* scales);
bool quantize_kv_row_avx512(const float* x, int64_t d, int8_t* q, float* scales);
}  // namespace cpu

}  // namespace snapserve::kernels
