// Raw-pointer launcher of the split-context ("flash-decoding") CUDA paged
// decode attention. Same contract as launch_paged_decode_attention
// (kernels/paged_attention/paged_attention.h, paged_attention_cuda.h) for the shapes it
// supports, but each sequence's context is cut into partitions of
// plan.partition_size entries that separate thread blocks read at once, so a
// long context of one sequence keeps every multiprocessor streaming its K/V
// instead of one block per query head. Each thread block serves all query
// heads of one KV head (up to kSplitDecodeHeadsPerBlock; a larger GQA group
// takes several blocks), so an entry's K and V are read once for the group.
// Per partition it stores the softmax's max, sum and unnormalized weighted V
// sum in float32 (the workspace); a second kernel merges the partitions. With
// one partition the first kernel writes the output directly.
// Nothing is synchronized; context_lens and block ids are trusted.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/paged_attention/paged_attention_cuda.h"  // FloatType

namespace snapserve::kernels::cuda {

// head_dim: a multiple of 16, at most 256. Query heads per thread block.
inline constexpr int kSplitDecodeMaxHeadDim = 256;
inline constexpr int kSplitDecodeHeadDimMultiple = 16;
inline constexpr int kSplitDecodeHeadsPerBlock = 8;
// Partition sizes the plan picks from (powers of two), and the most
// partitions one sequence may be cut into (the merge keeps a weight per
// partition in shared memory).
inline constexpr int kSplitDecodeMinPartition = 64;
inline constexpr int kSplitDecodeMaxPartition = 512;
inline constexpr int kSplitDecodeMaxSplits = 4096;

struct SplitDecodePlan {
  int partition_size = 0;       // entries per partition
  int num_splits = 0;           // partitions of the longest possible context
  int64_t workspace_bytes = 0;  // float32 partial results; 0 when num_splits == 1
};

// Whether the split kernel takes these shapes (otherwise use
// launch_paged_decode_attention).
bool split_decode_supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);

// The partition size and workspace for one launch. max_context bounds every
// context_lens entry (max_blocks * block_size); num_sms is the device's
// multiprocessor count. Partitions shrink from kSplitDecodeMaxPartition
// until there are about four thread blocks per multiprocessor, or
// kSplitDecodeMinPartition is reached. forced_partition > 0 takes that size
// instead (a power of two within the limits; for tests and benchmarks).
// num_splits == 0 means the context is too long for the merge's limit.
SplitDecodePlan plan_split_decode(int64_t batch, int64_t num_heads, int64_t num_kv_heads,
                                  int64_t head_dim, int64_t max_context, int num_sms,
                                  int forced_partition = 0);

// All device pointers 16-byte aligned, tensors contiguous. workspace: at
// least plan.workspace_bytes (unused when num_splits == 1), 16-byte aligned.
cudaError_t launch_split_decode_attention(
    FloatType type, const SplitDecodePlan& plan,
    void* out,                    // [batch, num_heads, head_dim]
    const void* q,                // [batch, num_heads, head_dim]
    const void* key_cache,        // [num_blocks, num_kv_heads, block_size, head_dim]
    const void* value_cache,      // [num_blocks, num_kv_heads, block_size, head_dim]
    const int32_t* block_tables,  // [batch, max_blocks]
    const int32_t* context_lens,  // [batch], each in [0, max_blocks * block_size]; 0: zeros out
    int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
    int64_t max_blocks, float scale, void* workspace, cudaStream_t stream);

}  // namespace snapserve::kernels::cuda
