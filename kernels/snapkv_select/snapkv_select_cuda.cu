// CUDA path of snapkv_scores (steps 3-6), snapkv_select (3-7) and snapkv_gather
// (docs/snapkv.md). No
// LibTorch headers here: kernels/snapkv_select/snapkv_select.cc checks the tensors, converts
// them to float32, allocates scratch and calls the launchers below in order on
// the current stream.
//
// The kernels follow the CPU path's order of operations (kernels/
// snapkv_select_cpu.cc): dot products accumulate sequentially over head_dim
// with explicit round-to-nearest multiply and add (no FMA contraction), window
// rows and group heads are summed in index order, pooling walks left to right.
// What still differs is expf and the order of the softmax denominator's sum
// (a block reduction here), so scores agree to float32 rounding, not bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/snapkv_select/snapkv_select_cuda.h"

namespace snapserve::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;    // softmax: one block per (head, window row)
constexpr int kColThreads = 256;    // group scores, pooling: one thread per position
constexpr int kTopkThreads = 1024;  // top-k: one block per KV head
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// Block-wide reductions; blockDim.x is a multiple of 32. scratch: [32].
__device__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : -INFINITY;
    v = warp_max(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float r = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float r = scratch[0];
  __syncthreads();
  return r;
}

// Grid (w, num_heads), block kRowThreads, dynamic shared memory d floats.
__global__ void snapkv_softmax_kernel(const float* __restrict__ q,       // [num_heads, w, d]
                                      const float* __restrict__ keys_t,  // [num_kv_heads, d, n]
                                      float* __restrict__ probs,         // [num_heads, w, n]
                                      int group, int w, int n, int d, float scale) {
  extern __shared__ float q_row[];  // [d]
  __shared__ float scratch[32];
  const int i = blockIdx.x;
  const int h = blockIdx.y;
  const float* q_src = q + (static_cast<int64_t>(h) * w + i) * d;
  for (int t = threadIdx.x; t < d; t += blockDim.x) q_row[t] = q_src[t];
  __syncthreads();

  const float* kt = keys_t + static_cast<int64_t>(h / group) * d * n;
  float* row = probs + (static_cast<int64_t>(h) * w + i) * n;
  const int visible = n - w + i + 1;  // causal inside the window

  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    float acc = 0.0f;
    for (int dd = 0; dd < d; ++dd) {
      acc = __fadd_rn(acc, __fmul_rn(q_row[dd], kt[static_cast<int64_t>(dd) * n + j]));
    }
    const float x = __fmul_rn(acc, scale);
    row[j] = x;
    local_max = fmaxf(local_max, x);
  }
  const float m = block_max(local_max, scratch);

  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    local_sum += e;
  }
  const float sum = block_sum(local_sum, scratch);
  for (int j = threadIdx.x; j < visible; j += blockDim.x) row[j] = __fdiv_rn(row[j], sum);
}

// Grid (ceil(len / kColThreads), num_kv_heads), one thread per prefix position.
__global__ void snapkv_group_scores_kernel(const float* __restrict__ probs,  // [num_heads, w, n]
                                           float* __restrict__ reduced,  // [num_kv_heads, n - w]
                                           int group, int w, int n, bool group_max) {
  const int len = n - w;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= len) return;
  const int g = blockIdx.y;
  float acc = 0.0f;
  for (int t = 0; t < group; ++t) {
    const int64_t h = static_cast<int64_t>(g) * group + t;
    float s = 0.0f;
    for (int i = 0; i < w; ++i) s = __fadd_rn(s, probs[(h * w + i) * n + j]);
    acc = t == 0 ? s : (group_max ? fmaxf(acc, s) : __fadd_rn(acc, s));
  }
  reduced[static_cast<int64_t>(g) * len + j] =
      group_max ? acc : __fdiv_rn(acc, static_cast<float>(group));
}

// Grid (ceil(len / kColThreads), num_kv_heads), one thread per position.
__global__ void snapkv_pool_kernel(const float* __restrict__ reduced,  // [num_kv_heads, len]
                                   float* __restrict__ pooled,         // [num_kv_heads, len]
                                   int len, int kernel_size, bool avg) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= len) return;
  const float* s = reduced + static_cast<int64_t>(blockIdx.y) * len;
  const int r = kernel_size / 2;
  const int lo = max(0, j - r);
  const int hi = min(len - 1, j + r);
  float v;
  if (avg) {
    v = 0.0f;
    for (int t = lo; t <= hi; ++t) v = __fadd_rn(v, s[t]);
    v = __fdiv_rn(v, static_cast<float>(kernel_size));
  } else {
    v = s[lo];
    for (int t = lo + 1; t <= hi; ++t) v = fmaxf(v, s[t]);
  }
  pooled[static_cast<int64_t>(blockIdx.y) * len + j] = v;
}

// Score -> unsigned key in float order; NaN lowest, -0 == +0 (as the CPU path).
__device__ __forceinline__ uint32_t order_key(float s) {
  if (isnan(s)) return 0u;
  if (s == 0.0f) s = 0.0f;
  const uint32_t bits = __float_as_uint(s);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Unique 64-bit rank: higher score first, then lower position.
__device__ __forceinline__ uint64_t rank_key(const float* p, int j) {
  return (static_cast<uint64_t>(order_key(p[j])) << 32) |
         static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(j));
}

// Grid (num_kv_heads), block kTopkThreads. Radix select (8 passes of 8 bits,
// most significant first) finds the top-th largest rank key T; the kept prefix
// positions are exactly those with key >= T, since keys are unique. A
// block-wide scan then writes them in position order, so no sort is needed.
__global__ void snapkv_topk_kernel(const float* __restrict__ pooled,  // [num_kv_heads, len]
                                   int64_t* __restrict__ out,         // [num_kv_heads, top + w]
                                   int len, int top, int w) {
  __shared__ unsigned int hist[256];
  __shared__ uint64_t s_prefix;
  __shared__ int s_remaining;
  __shared__ int warp_offsets[32];
  __shared__ int s_written;
  const float* p = pooled + static_cast<int64_t>(blockIdx.x) * len;
  int64_t* o = out + static_cast<int64_t>(blockIdx.x) * (top + w);

  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_remaining = top;
    s_written = 0;
  }
  uint64_t mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint64_t prefix = s_prefix;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
      const uint64_t key = rank_key(p, j);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Walk digits from the top; the remaining rank falls in the first bin
      // whose count reaches it (bin 0 by elimination).
      int remaining = s_remaining;
      int digit = 255;
      for (; digit > 0; --digit) {
        if (static_cast<int>(hist[digit]) >= remaining) break;
        remaining -= static_cast<int>(hist[digit]);
      }
      s_prefix = prefix | (static_cast<uint64_t>(digit) << shift);
      s_remaining = remaining;
    }
    mask |= static_cast<uint64_t>(0xFF) << shift;
    __syncthreads();
  }
  const uint64_t threshold = s_prefix;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  for (int base = 0; base < len; base += blockDim.x) {
    const int j = base + threadIdx.x;
    const int flag = (j < len && rank_key(p, j) >= threshold) ? 1 : 0;
    int incl = flag;  // inclusive scan within the warp
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(kFullMask, incl, off);
      if (lane >= off) incl += y;
    }
    if (lane == 31) warp_offsets[warp] = incl;
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the warp totals
      const int v = lane < num_warps ? warp_offsets[lane] : 0;
      int v_incl = v;
      for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(kFullMask, v_incl, off);
        if (lane >= off) v_incl += y;
      }
      if (lane < num_warps) warp_offsets[lane] = v_incl - v;
    }
    __syncthreads();
    const int written = s_written;
    const int rank = written + warp_offsets[warp] + incl;  // inclusive
    if (flag) o[rank - 1] = j;
    __syncthreads();  // everyone has read s_written
    if (threadIdx.x == blockDim.x - 1) s_written = rank;
    __syncthreads();
  }
  for (int t = threadIdx.x; t < w; t += blockDim.x) o[top + t] = len + t;
}

// Grid (kept, num_kv_heads); T is an unsigned integer of the element's size,
// so one kernel moves any dtype bit for bit.
template <typename T>
__global__ void snapkv_gather_kernel(const T* __restrict__ src,  // [num_kv_heads, n, d] strided
                                     const int64_t* __restrict__ indices,  // [num_kv_heads, kept]
                                     T* __restrict__ out,  // [num_kv_heads, kept, d]
                                     int64_t head_stride, int64_t pos_stride, int64_t n,
                                     int64_t kept, int64_t d) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kept + blockIdx.x;
  const int64_t pos = indices[row];
  T* dst = out + row * d;
  if (pos < 0 || pos >= n) {
    for (int64_t t = threadIdx.x; t < d; t += blockDim.x) dst[t] = T{0};
    return;
  }
  const T* from = src + blockIdx.y * head_stride + pos * pos_stride;
  for (int64_t t = threadIdx.x; t < d; t += blockDim.x) dst[t] = from[t];
}

unsigned int blocks_for(int64_t count, int threads) {
  return static_cast<unsigned int>((count + threads - 1) / threads);
}

}  // namespace

cudaError_t launch_snapkv_softmax(const float* q, const float* keys_t, float* probs,
                                  int64_t num_heads, int64_t num_kv_heads, int64_t w, int64_t n,
                                  int64_t d, float scale, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(w), static_cast<unsigned int>(num_heads));
  const size_t shared = static_cast<size_t>(d) * sizeof(float);
  snapkv_softmax_kernel<<<grid, kRowThreads, shared, stream>>>(
      q, keys_t, probs, static_cast<int>(num_heads / num_kv_heads), static_cast<int>(w),
      static_cast<int>(n), static_cast<int>(d), scale);
  return cudaGetLastError();
}

cudaError_t launch_snapkv_group_scores(const float* probs, float* reduced, int64_t num_heads,
                                       int64_t num_kv_heads, int64_t w, int64_t n, bool group_max,
                                       cudaStream_t stream) {
  const dim3 grid(blocks_for(n - w, kColThreads), static_cast<unsigned int>(num_kv_heads));
  snapkv_group_scores_kernel<<<grid, kColThreads, 0, stream>>>(
      probs, reduced, static_cast<int>(num_heads / num_kv_heads), static_cast<int>(w),
      static_cast<int>(n), group_max);
  return cudaGetLastError();
}

cudaError_t launch_snapkv_pool(const float* reduced, float* pooled, int64_t num_kv_heads,
                               int64_t len, int64_t kernel_size, bool avg, cudaStream_t stream) {
  const dim3 grid(blocks_for(len, kColThreads), static_cast<unsigned int>(num_kv_heads));
  snapkv_pool_kernel<<<grid, kColThreads, 0, stream>>>(reduced, pooled, static_cast<int>(len),
                                                       static_cast<int>(kernel_size), avg);
  return cudaGetLastError();
}

cudaError_t launch_snapkv_topk(const float* pooled, int64_t* out, int64_t num_kv_heads, int64_t len,
                               int64_t top, int64_t w, cudaStream_t stream) {
  snapkv_topk_kernel<<<static_cast<unsigned int>(num_kv_heads), kTopkThreads, 0, stream>>>(
      pooled, out, static_cast<int>(len), static_cast<int>(top), static_cast<int>(w));
  return cudaGetLastError();
}

cudaError_t launch_snapkv_gather(const void* src, int64_t head_stride, int64_t pos_stride,
                                 const int64_t* indices, void* out, int64_t num_kv_heads, int64_t n,
                                 int64_t kept, int64_t d, int64_t elem_size, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(kept), static_cast<unsigned int>(num_kv_heads));
  const int threads = d >= 256 ? 256 : static_cast<int>((d + 31) / 32 * 32);
  switch (elem_size) {
    case 1:
      snapkv_gather_kernel<<<grid, threads, 0, stream>>>(static_cast<const uint8_t*>(src), indices,
                                                         static_cast<uint8_t*>(out), head_stride,
                                                         pos_stride, n, kept, d);
      break;
    case 2:
      snapkv_gather_kernel<<<grid, threads, 0, stream>>>(static_cast<const uint16_t*>(src), indices,
                                                         static_cast<uint16_t*>(out), head_stride,
                                                         pos_stride, n, kept, d);
      break;
    case 4:
      snapkv_gather_kernel<<<grid, threads, 0, stream>>>(static_cast<const uint32_t*>(src), indices,
                                                         static_cast<uint32_t*>(out), head_stride,
                                                         pos_stride, n, kept, d);
      break;
    case 8:
      snapkv_gather_kernel<<<grid, threads, 0, stream>>>(static_cast<const uint64_t*>(src), indices,
                                                         static_cast<uint64_t*>(out), head_stride,
                                                         pos_stride, n, kept, d);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace snapserve::kernels::cuda
