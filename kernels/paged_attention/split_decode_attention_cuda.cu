// Split-context CUDA paged decode attention (contract and design in
// split_decode_attention_cuda.h).
//
// Thread block (kThreads threads) = one (sequence, KV head, chunk of up to kQ
// query heads, partition). kTPR threads share an entry: each holds 16 of its
// head_dim values (16-byte loads), so kThreads / kTPR entries are read at
// once, two such rounds in flight before any arithmetic. Three passes over
// the partition:
//   1. scores: q·k for the kQ heads, summed over the kTPR threads by
//      shuffles, into shared memory;
//   2. softmax per head over the partition (its max and sum kept);
//   3. values: each thread accumulates p · v for its 16 dims and kQ heads;
//      the entries' threads are summed by shuffles within a warp, then the
//      warps through shared memory.
// Shared memory: the partition's entry offsets (int64), then the scores
// [kQ, partition], reused after pass 3 for the warps' sums [kWarps, kQ,
// head_dim].
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_float_io.h"
#include "kernels/paged_attention/split_decode_attention_cuda.h"

namespace snapserve::kernels::cuda {

namespace {

using io::from_float;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kElems = 16;  // head_dim values per thread
constexpr int kUnroll = 2;  // rounds of entries loaded before they are used
constexpr int kMergeThreads = 128;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Bytes of dynamic shared memory of the partition kernel.
int64_t partition_smem_bytes(int heads_per_block, int64_t partition, int64_t head_dim) {
  const int64_t floats = std::max<int64_t>(
      heads_per_block * partition, static_cast<int64_t>(kWarps) * heads_per_block * head_dim);
  return partition * static_cast<int64_t>(sizeof(int64_t)) + floats * 4;
}

template <typename T, int kQ, int kTPR>
__global__ void __launch_bounds__(kThreads) split_decode_partition_kernel(
    T* __restrict__ out,                       // [batch, num_heads, head_dim] (one split only)
    float* __restrict__ ws_acc,                // [batch * num_heads, num_splits, head_dim]
    float* __restrict__ ws_max,                // [batch * num_heads, num_splits]
    float* __restrict__ ws_sum,                // [batch * num_heads, num_splits]
    const T* __restrict__ q,                   // [batch, num_heads, head_dim]
    const T* __restrict__ key_cache,           // [num_blocks, num_kv_heads, block_size, head_dim]
    const T* __restrict__ value_cache,         // [num_blocks, num_kv_heads, block_size, head_dim]
    const int32_t* __restrict__ block_tables,  // [batch, max_blocks]
    const int32_t* __restrict__ context_lens,  // [batch]
    int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks, int partition,
    int num_splits, float scale) {
  static_assert(kTPR * kElems <= kSplitDecodeMaxHeadDim && 32 % kTPR == 0, "bad kTPR");
  constexpr int kRows = kThreads / kTPR;  // entries read per round
  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* entry_offset = reinterpret_cast<int64_t*>(smem);            // [partition]
  float* scores = reinterpret_cast<float*>(entry_offset + partition);  // [kQ, partition]
  float* warp_acc = scores;  // after pass 3: [kWarps, kQ, head_dim]
  __shared__ float head_max[kQ];
  __shared__ float head_sum[kQ];

  const int split = blockIdx.x;
  const int group = num_heads / num_kv_heads;
  const int chunks = (group + kQ - 1) / kQ;
  const int kv_head = blockIdx.y / chunks;
  const int chunk_head = (blockIdx.y % chunks) * kQ;  // within the group
  const int heads_here = min(kQ, group - chunk_head);
  const int64_t seq = blockIdx.z;
  const int64_t first_row = seq * num_heads + static_cast<int64_t>(kv_head) * group + chunk_head;
  const int ctx = context_lens[seq];
  const int start = split * partition;
  // Split 0 always runs, so an empty context still writes its (zero) result.
  if (split > 0 && start >= ctx) return;
  const int n = max(0, min(partition, ctx - start));

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int entry_in_round = tid / kTPR;
  const int dim0 = (tid % kTPR) * kElems;
  const bool has_dims = dim0 < head_dim;

  const int32_t* table = block_tables + seq * max_blocks;
  for (int i = tid; i < n; i += kThreads) {
    const int t = start + i;
    const int64_t block = table[t / block_size];
    entry_offset[i] = ((block * num_kv_heads + kv_head) * block_size + t % block_size) *
                      static_cast<int64_t>(head_dim);
  }

  float qr[kQ][kElems];
#pragma unroll
  for (int h = 0; h < kQ; ++h) {
    if (h < heads_here && has_dims) {
      io::load16(q + (first_row + h) * head_dim + dim0, qr[h]);
#pragma unroll
      for (int e = 0; e < kElems; ++e) qr[h][e] *= scale;
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) qr[h][e] = 0.f;
    }
  }
  __syncthreads();  // entry_offset

  // Pass 1: scores. The loop bound is the same for every thread, so each
  // shuffle below runs on all 32 lanes.
  for (int base = 0; base < n; base += kUnroll * kRows) {
    float k[kUnroll][kElems];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRows + entry_in_round;
      if (i < n && has_dims) {
        io::load16(key_cache + entry_offset[i] + dim0, k[u]);
      } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) k[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float s[kQ];
#pragma unroll
      for (int h = 0; h < kQ; ++h) {
        s[h] = 0.f;
#pragma unroll
        for (int e = 0; e < kElems; ++e) s[h] += qr[h][e] * k[u][e];
#pragma unroll
        for (int offset = kTPR / 2; offset > 0; offset /= 2) {
          s[h] += __shfl_xor_sync(kFullMask, s[h], offset);
        }
      }
      const int i = base + u * kRows + entry_in_round;
      if (i < n && tid % kTPR == 0) {
#pragma unroll
        for (int h = 0; h < kQ; ++h) scores[h * partition + i] = s[h];
      }
    }
  }
  __syncthreads();

  // Pass 2: softmax over the partition, one warp per head.
  for (int h = warp; h < kQ; h += kWarps) {
    float* row = scores + h * partition;
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, row[i]);
    m = io::warp_max(m);
    float l = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float p = expf(row[i] - m);
      row[i] = p;
      l += p;
    }
    l = io::warp_sum(l);
    if (lane == 0) {
      head_max[h] = m;  // -inf for an empty partition, whose sum is 0
      head_sum[h] = l;
    }
  }
  __syncthreads();

  // Pass 3: values.
  float acc[kQ][kElems];
#pragma unroll
  for (int h = 0; h < kQ; ++h) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[h][e] = 0.f;
  }
  for (int base = 0; base < n; base += kUnroll * kRows) {
    float v[kUnroll][kElems];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRows + entry_in_round;
      if (i < n && has_dims) {
        io::load16(value_cache + entry_offset[i] + dim0, v[u]);
      } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) v[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRows + entry_in_round;
      if (i < n) {
#pragma unroll
        for (int h = 0; h < kQ; ++h) {
          const float p = scores[h * partition + i];
#pragma unroll
          for (int e = 0; e < kElems; ++e) acc[h][e] += p * v[u][e];
        }
      }
    }
  }
  // The warp's entries (lanes kTPR apart hold the same dims) summed into
  // lanes 0 .. kTPR-1.
#pragma unroll
  for (int h = 0; h < kQ; ++h) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
#pragma unroll
      for (int offset = kTPR; offset < 32; offset *= 2) {
        acc[h][e] += __shfl_xor_sync(kFullMask, acc[h][e], offset);
      }
    }
  }
  __syncthreads();  // every warp is done reading the scores warp_acc overwrites
  if (lane < kTPR && has_dims) {
#pragma unroll
    for (int h = 0; h < kQ; ++h) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        warp_acc[(warp * kQ + h) * head_dim + dim0 + e] = acc[h][e];
      }
    }
  }
  __syncthreads();

  for (int idx = tid; idx < heads_here * head_dim; idx += kThreads) {
    const int h = idx / head_dim;
    const int j = idx % head_dim;
    float x = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) x += warp_acc[(w * kQ + h) * head_dim + j];
    const int64_t row = first_row + h;
    if (num_splits == 1) {
      const float l = head_sum[h];
      out[row * head_dim + j] = from_float<T>(l > 0.f ? x / l : 0.f);
    } else {
      const int64_t r = row * num_splits + split;
      ws_acc[r * head_dim + j] = x;
      if (j == 0) {
        ws_max[r] = head_max[h];
        ws_sum[r] = head_sum[h];
      }
    }
  }
}

// Block-wide max / sum (kMergeThreads threads); every thread gets the result.
// Each starts with a barrier so that `scratch` can be reused call after call.
__device__ float block_max(float x, float* scratch) {
  __syncthreads();
  x = io::warp_max(x);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = -INFINITY;
#pragma unroll
  for (int w = 0; w < kMergeThreads / 32; ++w) r = fmaxf(r, scratch[w]);
  return r;
}
__device__ float block_sum(float x, float* scratch) {
  __syncthreads();
  x = io::warp_sum(x);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = 0.f;
#pragma unroll
  for (int w = 0; w < kMergeThreads / 32; ++w) r += scratch[w];
  return r;
}

// One thread block per (query head, sequence): rescales each partition's
// result by exp(its max - the global max) and divides by the merged sum.
template <typename T>
__global__ void __launch_bounds__(kMergeThreads) split_decode_merge_kernel(
    T* __restrict__ out,                       // [batch, num_heads, head_dim]
    const float* __restrict__ ws_acc,          // [batch * num_heads, num_splits, head_dim]
    const float* __restrict__ ws_max,          // [batch * num_heads, num_splits]
    const float* __restrict__ ws_sum,          // [batch * num_heads, num_splits]
    const int32_t* __restrict__ context_lens,  // [batch]
    int num_heads, int head_dim, int partition, int num_splits) {
  __shared__ float weight[kSplitDecodeMaxSplits];
  __shared__ float scratch[kMergeThreads / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.y) * num_heads + blockIdx.x;
  const int64_t ctx = context_lens[blockIdx.y];
  // Partitions past the context were never written.
  const int64_t touched = ctx <= 0 ? 0 : (ctx + partition - 1) / partition;
  const int used = static_cast<int>(touched < num_splits ? touched : num_splits);
  const float* maxes = ws_max + row * num_splits;
  const float* sums = ws_sum + row * num_splits;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < used; s += kMergeThreads) m = fmaxf(m, maxes[s]);
  m = block_max(m, scratch);
  float l = 0.f;
  for (int s = threadIdx.x; s < used; s += kMergeThreads) {
    const float w = expf(maxes[s] - m);
    weight[s] = w;
    l += w * sums[s];
  }
  l = block_sum(l, scratch);  // its barriers also publish `weight`
  const float* acc = ws_acc + row * num_splits * head_dim;
  for (int j = threadIdx.x; j < head_dim; j += kMergeThreads) {
    float x = 0.f;
    for (int s = 0; s < used; ++s) x += weight[s] * acc[static_cast<int64_t>(s) * head_dim + j];
    out[row * head_dim + j] = from_float<T>(l > 0.f ? x / l : 0.f);
  }
}

struct Args {
  const SplitDecodePlan& plan;
  void* out;
  const void* q;
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_tables;
  const int32_t* context_lens;
  int64_t batch, num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  float scale;
  void* workspace;
  cudaStream_t stream;
};

template <typename T, int kQ, int kTPR>
cudaError_t launch_typed(const Args& a) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t chunks = (group + kQ - 1) / kQ;
  const int64_t splits = a.plan.num_splits;
  const int64_t rows = a.batch * a.num_heads;
  float* ws_acc = static_cast<float*>(a.workspace);
  float* ws_max = splits > 1 ? ws_acc + rows * splits * a.head_dim : nullptr;
  float* ws_sum = splits > 1 ? ws_max + rows * splits : nullptr;
  if (splits == 1) ws_acc = nullptr;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(a.num_kv_heads * chunks),
                  static_cast<unsigned>(a.batch));
  const int64_t smem = partition_smem_bytes(kQ, a.plan.partition_size, a.head_dim);
  split_decode_partition_kernel<T, kQ, kTPR><<<grid, kThreads, smem, a.stream>>>(
      static_cast<T*>(a.out), ws_acc, ws_max, ws_sum, static_cast<const T*>(a.q),
      static_cast<const T*>(a.key_cache), static_cast<const T*>(a.value_cache), a.block_tables,
      a.context_lens, static_cast<int>(a.num_heads), static_cast<int>(a.num_kv_heads),
      static_cast<int>(a.head_dim), static_cast<int>(a.block_size), static_cast<int>(a.max_blocks),
      a.plan.partition_size, static_cast<int>(splits), a.scale);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  const dim3 merge_grid(static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.batch));
  split_decode_merge_kernel<T><<<merge_grid, kMergeThreads, 0, a.stream>>>(
      static_cast<T*>(a.out), ws_acc, ws_max, ws_sum, a.context_lens, static_cast<int>(a.num_heads),
      static_cast<int>(a.head_dim), a.plan.partition_size, static_cast<int>(splits));
  return cudaGetLastError();
}

// kTPR: the fewest threads per entry whose 16 dims each cover head_dim.
template <typename T, int kQ>
cudaError_t launch_heads(const Args& a) {
  if (a.head_dim <= 4 * kElems) return launch_typed<T, kQ, 4>(a);
  if (a.head_dim <= 8 * kElems) return launch_typed<T, kQ, 8>(a);
  return launch_typed<T, kQ, 16>(a);
}

// kQ: the smallest of 1, 2, 4, 8 that holds the GQA group (8 for larger
// groups, which take several thread blocks).
template <typename T>
cudaError_t launch_type(const Args& a) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  if (group <= 1) return launch_heads<T, 1>(a);
  if (group <= 2) return launch_heads<T, 2>(a);
  if (group <= 4) return launch_heads<T, 4>(a);
  return launch_heads<T, 8>(a);
}

int heads_per_block(int64_t group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kSplitDecodeHeadsPerBlock;
}

}  // namespace

bool split_decode_supports(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  return num_kv_heads > 0 && num_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0 &&
         head_dim <= kSplitDecodeMaxHeadDim && head_dim % kSplitDecodeHeadDimMultiple == 0;
}

SplitDecodePlan plan_split_decode(int64_t batch, int64_t num_heads, int64_t num_kv_heads,
                                  int64_t head_dim, int64_t max_context, int num_sms,
                                  int forced_partition) {
  SplitDecodePlan plan;
  if (!split_decode_supports(num_heads, num_kv_heads, head_dim)) return plan;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t chunks = (group + kSplitDecodeHeadsPerBlock - 1) / kSplitDecodeHeadsPerBlock;
  const int64_t blocks_per_split = batch * num_kv_heads * std::max<int64_t>(chunks, 1);
  const int64_t context = std::max<int64_t>(max_context, 1);
  auto splits_of = [&](int64_t partition) { return (context + partition - 1) / partition; };
  int64_t partition = kSplitDecodeMaxPartition;
  if (forced_partition > 0) {
    partition = forced_partition;
  } else {
    const int64_t target = 4 * static_cast<int64_t>(std::max(num_sms, 1));
    while (partition > kSplitDecodeMinPartition &&
           blocks_per_split * splits_of(partition) < target) {
      partition /= 2;
    }
  }
  const int64_t splits = splits_of(partition);
  if (splits > kSplitDecodeMaxSplits) return plan;
  plan.partition_size = static_cast<int>(partition);
  plan.num_splits = static_cast<int>(splits);
  plan.workspace_bytes = splits == 1 ? 0
                                     : batch * num_heads * splits * (head_dim + 2) *
                                           static_cast<int64_t>(sizeof(float));
  return plan;
}

cudaError_t launch_split_decode_attention(FloatType type, const SplitDecodePlan& plan, void* out,
                                          const void* q, const void* key_cache,
                                          const void* value_cache, const int32_t* block_tables,
                                          const int32_t* context_lens, int64_t batch,
                                          int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                          int64_t block_size, int64_t max_blocks, float scale,
                                          void* workspace, cudaStream_t stream) {
  if (batch == 0 || num_heads == 0) return cudaSuccess;
  const int64_t partition = plan.partition_size;
  const bool partition_ok = partition >= kSplitDecodeMinPartition &&
                            partition <= kSplitDecodeMaxPartition &&
                            (partition & (partition - 1)) == 0;
  const int64_t group = num_kv_heads > 0 ? num_heads / num_kv_heads : 0;
  const int64_t chunks = (group + kSplitDecodeHeadsPerBlock - 1) / kSplitDecodeHeadsPerBlock;
  // Launch limits: grid y and z below 2^16; indices inside the kernels are
  // int where these bounds keep them below 2^31.
  if (!split_decode_supports(num_heads, num_kv_heads, head_dim) || !partition_ok ||
      plan.num_splits < 1 || plan.num_splits > kSplitDecodeMaxSplits || batch < 0 ||
      batch > 65535 || num_kv_heads * chunks > 65535 || num_heads > 65535 || block_size <= 0 ||
      max_blocks < 0 || max_blocks * block_size > 2147483647 ||
      (plan.num_splits > 1 && workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  // A thread block's shared memory must fit the default 48 KiB.
  if (partition_smem_bytes(heads_per_block(group), partition, head_dim) > 48 * 1024) {
    return cudaErrorInvalidValue;
  }
  const Args a{plan,         out,   q,         key_cache,    value_cache, block_tables,
               context_lens, batch, num_heads, num_kv_heads, head_dim,    block_size,
               max_blocks,   scale, workspace, stream};
  switch (type) {
    case FloatType::kFloat32:
      return launch_type<float>(a);
    case FloatType::kBFloat16:
      return launch_type<__nv_bfloat16>(a);
    case FloatType::kFloat16:
      return launch_type<__half>(a);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snapserve::kernels::cuda
