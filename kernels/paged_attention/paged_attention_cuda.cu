// CUDA paged decode attention. One thread block per (query head, sequence);
// its warps take the context's entries round-robin, each warp keeps its own
// online-softmax state (running max, running sum, accumulator spread over the
// lanes), and the warps' states are merged once at the end through shared
// memory. Scores and accumulation are float32 for every input type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/paged_attention/paged_attention_cuda.h"

namespace snapserve::kernels::cuda {

namespace {

constexpr int kWarpSize = 32;
constexpr int kNumWarps = 8;
constexpr int kMaxPerLane = kPagedAttentionMaxHeadDim / kWarpSize;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }

__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half(x); }

__device__ __forceinline__ float warp_sum(float x) {
  // Butterfly: every lane ends with the full sum.
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

template <typename T>
__global__ void __launch_bounds__(kNumWarps* kWarpSize) paged_decode_attention_kernel(
    T* __restrict__ out,                       // [batch, num_heads, head_dim]
    const T* __restrict__ q,                   // [batch, num_heads, head_dim]
    const T* __restrict__ key_cache,           // [num_blocks, num_kv_heads, block_size, head_dim]
    const T* __restrict__ value_cache,         // [num_blocks, num_kv_heads, block_size, head_dim]
    const int32_t* __restrict__ block_tables,  // [batch, max_blocks]
    const int32_t* __restrict__ context_lens,  // [batch]
    int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks, float scale) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int ctx = context_lens[seq];

  // Lane `lane` owns dimensions lane, lane + 32, lane + 64, ...
  float qr[kMaxPerLane];
  float acc[kMaxPerLane];
  const T* qh = q + (static_cast<int64_t>(seq) * num_heads + head) * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int j = lane + i * kWarpSize;
    qr[i] = j < head_dim ? load(qh + j) * scale : 0.f;
    acc[i] = 0.f;
  }
  float run_max = -INFINITY;
  float run_sum = 0.f;

  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks;
  for (int t = warp; t < ctx; t += kNumWarps) {
    const int64_t block = table[t / block_size];
    const int64_t row = ((block * num_kv_heads + kv_head) * block_size + t % block_size) * head_dim;
    const T* k = key_cache + row;
    const T* v = value_cache + row;
    float partial = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int j = lane + i * kWarpSize;
      if (j < head_dim) partial += qr[i] * load(k + j);
    }
    const float score = warp_sum(partial);
    const float new_max = fmaxf(run_max, score);
    const float rescale = expf(run_max - new_max);  // 0 on the first entry
    const float p = expf(score - new_max);
    run_sum = run_sum * rescale + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int j = lane + i * kWarpSize;
      acc[i] = acc[i] * rescale + (j < head_dim ? p * load(v + j) : 0.f);
    }
    run_max = new_max;
  }

  __shared__ float warp_max[kNumWarps];
  __shared__ float warp_sum_s[kNumWarps];
  __shared__ float warp_acc[kNumWarps][kPagedAttentionMaxHeadDim];
  if (lane == 0) {
    warp_max[warp] = run_max;
    warp_sum_s[warp] = run_sum;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int j = lane + i * kWarpSize;
    if (j < head_dim) warp_acc[warp][j] = acc[i];
  }
  __syncthreads();

  float global_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kNumWarps; ++w) global_max = fmaxf(global_max, warp_max[w]);
  float total = 0.f;
  float weight[kNumWarps];
#pragma unroll
  for (int w = 0; w < kNumWarps; ++w) {
    // A warp that saw no entry (short context) has max -inf and weight 0.
    weight[w] = warp_max[w] == -INFINITY ? 0.f : expf(warp_max[w] - global_max);
    total += weight[w] * warp_sum_s[w];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;  // empty context: zeros
  T* oh = out + (static_cast<int64_t>(seq) * num_heads + head) * head_dim;
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
    float x = 0.f;
#pragma unroll
    for (int w = 0; w < kNumWarps; ++w) x += weight[w] * warp_acc[w][j];
    store(oh + j, x * inv);
  }
}

template <typename T>
cudaError_t launch(void* out, const void* q, const void* key_cache, const void* value_cache,
                   const int32_t* block_tables, const int32_t* context_lens, int batch,
                   int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks,
                   float scale, cudaStream_t stream) {
  if (batch == 0 || num_heads == 0) return cudaSuccess;
  const dim3 grid(num_heads, batch);
  const dim3 block(kNumWarps * kWarpSize);
  paged_decode_attention_kernel<T><<<grid, block, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(q), static_cast<const T*>(key_cache),
      static_cast<const T*>(value_cache), block_tables, context_lens, num_heads, num_kv_heads,
      head_dim, block_size, max_blocks, scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_paged_decode_attention(FloatType type, void* out, const void* q,
                                          const void* key_cache, const void* value_cache,
                                          const int32_t* block_tables, const int32_t* context_lens,
                                          int batch, int num_heads, int num_kv_heads, int head_dim,
                                          int block_size, int max_blocks, float scale,
                                          cudaStream_t stream) {
  switch (type) {
    case FloatType::kFloat32:
      return launch<float>(out, q, key_cache, value_cache, block_tables, context_lens, batch,
                           num_heads, num_kv_heads, head_dim, block_size, max_blocks, scale,
                           stream);
    case FloatType::kBFloat16:
      return launch<__nv_bfloat16>(out, q, key_cache, value_cache, block_tables, context_lens,
                                   batch, num_heads, num_kv_heads, head_dim, block_size, max_blocks,
                                   scale, stream);
    case FloatType::kFloat16:
      return launch<__half>(out, q, key_cache, value_cache, block_tables, context_lens, batch,
                            num_heads, num_kv_heads, head_dim, block_size, max_blocks, scale,
                            stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snapserve::kernels::cuda
