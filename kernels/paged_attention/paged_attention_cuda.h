// Raw-pointer launchers for the CUDA paged decode attention and KV append
// kernels. No LibTorch types cross this header: the .cc dispatchers check the
// tensors and pass data pointers plus the current stream; nvcc never parses
// LibTorch. Launchers only enqueue work and never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace snapserve::kernels::cuda {

enum class FloatType { kFloat32, kBFloat16, kFloat16 };

// The largest head_dim the CUDA kernel supports (each lane holds 8 elements).
inline constexpr int kPagedAttentionMaxHeadDim = 256;

// Shapes as in kernels/paged_attention/paged_attention.h; all pointers are contiguous device
// memory of element type `type` (block_tables and context_lens are int32).
// Returns the launch error, if any (never waits for the kernel).
cudaError_t launch_paged_decode_attention(
    FloatType type,
    void* out,                    // [batch, num_heads, head_dim]
    const void* q,                // [batch, num_heads, head_dim]
    const void* key_cache,        // [num_blocks, num_kv_heads, block_size, head_dim]
    const void* value_cache,      // [num_blocks, num_kv_heads, block_size, head_dim]
    const int32_t* block_tables,  // [batch, max_blocks]
    const int32_t* context_lens,  // [batch]
    int batch, int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks,
    float scale, cudaStream_t stream);

}  // namespace snapserve::kernels::cuda
