// Paged decode attention (docs/kv-cache-and-scheduling.md, "Decode step"): one
// new query token per sequence attends over that sequence's cached K/V entries,
// which live in fixed-size blocks of a shared pool addressed through a block
// table. Knows nothing of requests or of how blocks are allocated (engine/kv
// owns that).
#pragma once

#include <ATen/core/Tensor.h>

namespace snapserve::kernels {

// q            [B, H, d]                              float32 / bfloat16 / float16
// key_cache    [num_blocks, G, block_size, d]         same dtype and device as q (on CPU
//                                                     a float32 q may also read a
//                                                     bfloat16/float16 cache, or an int8
//                                                     one with its scales)
// value_cache  [num_blocks, G, block_size, d]
// block_tables [B, max_blocks] int32: sequence b's entry t is in block
//              block_tables[b][t / block_size] at offset t % block_size
// context_lens [B] int32, each in [1, max_blocks * block_size]
// scale        multiplies q·k (usually 1/sqrt(d))
// returns      [B, H, d] in q's dtype.
// GQA: H is a multiple of G and query head h reads KV head h / (H / G).
// Softmax and accumulation are float32 whatever the input dtype. On CUDA the
// op runs on the current stream and never synchronizes; context_lens and the
// block ids are trusted there (validated on CPU only, where it is cheap).
// key_scales, value_scales: only for an int8 cache (kernels/kv_append/kv_append.h,
//              kv_append_int8): float32 [num_blocks, G, block_size, d / 16].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale,
                                  const at::Tensor& key_scales = {},
                                  const at::Tensor& value_scales = {});

namespace cpu {
// Same contract; inputs already checked, contiguous and on CPU.
void paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale, at::Tensor& out,
                            const at::Tensor& key_scales = {}, const at::Tensor& value_scales = {});
}  // namespace cpu

}  // namespace snapserve::kernels
