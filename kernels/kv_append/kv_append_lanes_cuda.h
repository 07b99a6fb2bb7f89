// Raw-pointer launcher of the CUDA KV append into the paged cache's lanes
// (engine/kv/paged_kv_cache.h: each block holds one (layer, KV head) lane, so
// the cache is [num_blocks, 1, block_size, head_dim] and lane slot s is row s
// of its [num_blocks * block_size, head_dim] view). It reads the new K and V
// rows where the qkv product left them (any token and head strides), so a
// decode step appends without first copying them into a contiguous tensor.
// The copy is dtype-blind: only the element size matters.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace snapserve::kernels::cuda {

// Row (t, g) of k and of v goes to slot slots[t * lanes + g] of its cache; a
// negative slot skips the row (padding). Slots must be distinct and below the
// cache's num_blocks * block_size (trusted: nothing is read back to check).
// elem_size is 2 or 4. Enqueues on `stream`, never waits; returns the launch
// error, if any.
cudaError_t launch_kv_append_lanes(
    int elem_size,
    void* key_cache,       // [num_slots, head_dim] contiguous
    void* value_cache,     // [num_slots, head_dim] contiguous
    const void* k,         // [tokens, lanes, head_dim], strides (token_stride,
                           //  lane_stride, 1) in elements
    const void* v,         // [tokens, lanes, head_dim], the same strides
    const int64_t* slots,  // [tokens, lanes] contiguous
    int64_t tokens, int64_t lanes, int64_t head_dim, int64_t token_stride, int64_t lane_stride,
    cudaStream_t stream);

}  // namespace snapserve::kernels::cuda
