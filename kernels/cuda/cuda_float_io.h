// Device-side reads and writes of float32, bfloat16 and float16 values as
// float32, shared by the fused CUDA kernels (fused_rowwise_cuda.cu,
// split_decode_attention_cuda.cu). Only .cu files include it. Conversions
// to 16 bits round to nearest, ties to even, as Tensor::to does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace snapserve::kernels::cuda::io {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// x rounded to T and read back: what a tensor of dtype T would hold.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// Two 16-bit values packed in one 32-bit word (element 0 in the low half).
__device__ __forceinline__ void unpack2(uint32_t w, __nv_bfloat16*, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);  // a bfloat16 is the top half of a float32
  hi = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ void unpack2(uint32_t w, __half*, float& lo, float& hi) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  lo = f.x;
  hi = f.y;
}

// Sixteen consecutive elements from `p`, which must be 16-byte aligned, through
// the read-only data path (the data is not written while the kernel runs).
__device__ __forceinline__ void load16(const float* p, float (&x)[16]) {
  const float4* v = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 f = __ldg(v + i);
    x[4 * i] = f.x;
    x[4 * i + 1] = f.y;
    x[4 * i + 2] = f.z;
    x[4 * i + 3] = f.w;
  }
}
template <typename T>
__device__ __forceinline__ void load16(const T* p, float (&x)[16]) {
  static_assert(sizeof(T) == 2, "16-bit element types only");
  const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint4 u = __ldg(v + i);
    unpack2(u.x, static_cast<T*>(nullptr), x[8 * i], x[8 * i + 1]);
    unpack2(u.y, static_cast<T*>(nullptr), x[8 * i + 2], x[8 * i + 3]);
    unpack2(u.z, static_cast<T*>(nullptr), x[8 * i + 4], x[8 * i + 5]);
    unpack2(u.w, static_cast<T*>(nullptr), x[8 * i + 6], x[8 * i + 7]);
  }
}

// Sums / maxima over the 32 lanes of a warp; every lane gets the result.
// All 32 lanes must call them (full mask).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, offset));
  }
  return x;
}

}  // namespace snapserve::kernels::cuda::io
