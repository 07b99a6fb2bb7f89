// KV append: scatters new K/V entries into the paged cache at slots chosen by
// the caller (engine/kv computes them from block tables). Used after prefill
// (the entries SnapKV kept) and at every decode step (one entry per sequence).
#pragma once

#include <ATen/core/Tensor.h>

namespace snapserve::kernels {

// key_cache, value_cache [num_blocks, G, block_size, d], contiguous; written in place
// k, v                   [T, G, d], same device as the caches; the caches' dtype, or
//                        float32 into a 16-bit cache on CPU (rounded as Tensor::to
//                        rounds: to nearest, ties to even), which saves a decode step
//                        two conversions per layer
// slot_mapping           [T] int64: token i goes to block slot_mapping[i] / block_size
//                        at offset slot_mapping[i] % block_size; a negative slot skips
//                        token i (padding). Slots must be distinct.
// On CPU slots past the cache are an error; on CUDA they are trusted (no sync).
void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping);

namespace cpu {
// Same contract; inputs already checked, contiguous and on CPU.
void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping);
}  // namespace cpu

}  // namespace snapserve::kernels
