// Raw-pointer launcher for the CUDA KV append kernel (see kernels/kv_append/kv_append.h
// for the contract). The copy is dtype-blind: only the element size matters.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace snapserve::kernels::cuda {

// elem_size is 2 (bfloat16, float16) or 4 (float32). Enqueues on `stream`,
// never waits; returns the launch error, if any.
cudaError_t launch_kv_append(int elem_size,
                             void* key_cache,    // [num_blocks, num_kv_heads, block_size, head_dim]
                             void* value_cache,  // [num_blocks, num_kv_heads, block_size, head_dim]
                             const void* k,      // [num_tokens, num_kv_heads, head_dim]
                             const void* v,      // [num_tokens, num_kv_heads, head_dim]
                             const int64_t* slot_mapping,  // [num_tokens]
                             int num_tokens, int num_kv_heads, int head_dim, int block_size,
                             cudaStream_t stream);

}  // namespace snapserve::kernels::cuda
