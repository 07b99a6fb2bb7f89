// CUDA row-wise steps of the decoder layer (contracts in fused_rowwise_cuda.h).
// RMSNorm: one thread block per row, a block-wide float32 sum of squares.
// RoPE: one thread block per token; the token's cos/sin are computed once into
// shared memory and shared by all its heads. SwiGLU: one thread per output
// element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/cuda_float_io.h"
#include "kernels/fused/fused_rowwise_cuda.h"

namespace snapserve::kernels::cuda {

namespace {

using io::from_float;
using io::round_to;
using io::to_float;

constexpr int kNormThreads = 256;
constexpr int kRopeThreads = 128;
constexpr int kSiluThreads = 256;

// Sum over the thread block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. `scratch` holds 32 floats.
__device__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  x = io::warp_sum(x);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.f;
  total = io::warp_sum(total);
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_add_kernel(float* __restrict__ residual,  // [rows, n], row stride residual_stride
                        const T* __restrict__ delta,  // [rows, n], row stride delta_stride, or null
                        const T* __restrict__ weight,  // [n]
                        T* __restrict__ out,           // [rows, n] contiguous
                        int n, int64_t residual_stride, int64_t delta_stride, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float* x = residual + row * residual_stride;
  const T* d = delta == nullptr ? nullptr : delta + row * delta_stride;
  float squares = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = x[i];
    if (d != nullptr) {
      v += to_float(d[i]);
      x[i] = v;  // read back below by this same thread only
    }
    squares += v * v;
  }
  squares = block_sum(squares, scratch);
  const float r = 1.0f / sqrtf(squares / static_cast<float>(n) + eps);
  T* o = out + row * static_cast<int64_t>(n);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    o[i] = from_float<T>(to_float(weight[i]) * round_to<T>(x[i] * r));
  }
}

template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_qk_kernel(T* __restrict__ x,  // [tokens, heads, head_dim], strides (token_stride,
                                       //  head_stride, 1)
                   const int64_t* __restrict__ positions,  // [tokens]
                   const float* __restrict__ inv_freq,     // [head_dim / 2]
                   int heads, int head_dim, int64_t token_stride, int64_t head_stride) {
  __shared__ float cos_s[kRopeMaxHeadDim / 2];
  __shared__ float sin_s[kRopeMaxHeadDim / 2];
  const int64_t token = blockIdx.x;
  const int half = head_dim / 2;
  // The position converted to float32 first, as transformers' RoPE does.
  const float pos = static_cast<float>(positions[token]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float f = pos * inv_freq[i];
    sincosf(f, &sin_s[i], &cos_s[i]);
  }
  __syncthreads();
  T* base = x + token * token_stride;
  const int pairs = heads * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half;
    const int i = p % half;
    T* h = base + head * head_stride;
    const float x0 = to_float(h[i]);
    const float x1 = to_float(h[i + half]);
    const float c = cos_s[i];
    const float s = sin_s[i];
    h[i] = from_float<T>(x0 * c - x1 * s);
    h[i + half] = from_float<T>(x1 * c + x0 * s);
  }
}

template <typename T>
__global__ void __launch_bounds__(kSiluThreads)
    silu_mul_kernel(T* __restrict__ out,            // [rows, inter] contiguous
                    const T* __restrict__ gate_up,  // [rows, 2 * inter], row stride gate_up_stride
                    int64_t inter, int64_t gate_up_stride) {
  const int64_t row = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= inter) return;
  const T* g = gate_up + row * gate_up_stride;
  const float gate = to_float(g[j]);
  const float up = to_float(g[inter + j]);
  out[row * inter + j] = from_float<T>(gate / (1.0f + expf(-gate)) * up);
}

template <typename T>
cudaError_t rms_norm_add(float* residual, const void* delta, const void* weight, void* out,
                         int64_t rows, int64_t n, int64_t residual_stride, int64_t delta_stride,
                         float eps, cudaStream_t stream) {
  rms_norm_add_kernel<T><<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(
      residual, static_cast<const T*>(delta), static_cast<const T*>(weight), static_cast<T*>(out),
      static_cast<int>(n), residual_stride, delta_stride, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t rope_qk(void* x, const int64_t* positions, const float* inv_freq, int64_t tokens,
                    int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
                    cudaStream_t stream) {
  rope_qk_kernel<T><<<static_cast<unsigned>(tokens), kRopeThreads, 0, stream>>>(
      static_cast<T*>(x), positions, inv_freq, static_cast<int>(heads), static_cast<int>(head_dim),
      token_stride, head_stride);
  return cudaGetLastError();
}

template <typename T>
cudaError_t silu_mul(void* out, const void* gate_up, int64_t rows, int64_t inter,
                     int64_t gate_up_stride, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((inter + kSiluThreads - 1) / kSiluThreads));
  silu_mul_kernel<T><<<grid, kSiluThreads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(gate_up), inter, gate_up_stride);
  return cudaGetLastError();
}

// Launch limits: a grid's x size is below 2^31, its y size below 2^16.
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

}  // namespace

cudaError_t launch_rms_norm_add(FloatType type, float* residual, const void* delta,
                                const void* weight, void* out, int64_t rows, int64_t n,
                                int64_t residual_stride, int64_t delta_stride, float eps,
                                cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  if (rows < 0 || rows > kMaxGridX || n < 0 || n > 2147483647) return cudaErrorInvalidValue;
  switch (type) {
    case FloatType::kFloat32:
      return rms_norm_add<float>(residual, delta, weight, out, rows, n, residual_stride,
                                 delta_stride, eps, stream);
    case FloatType::kBFloat16:
      return rms_norm_add<__nv_bfloat16>(residual, delta, weight, out, rows, n, residual_stride,
                                         delta_stride, eps, stream);
    case FloatType::kFloat16:
      return rms_norm_add<__half>(residual, delta, weight, out, rows, n, residual_stride,
                                  delta_stride, eps, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_rope_qk(FloatType type, void* x, const int64_t* positions, const float* inv_freq,
                           int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                           int64_t head_stride, cudaStream_t stream) {
  if (tokens == 0 || heads == 0) return cudaSuccess;
  if (tokens < 0 || tokens > kMaxGridX || heads < 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      head_dim > kRopeMaxHeadDim || heads * head_dim > 2147483647) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case FloatType::kFloat32:
      return rope_qk<float>(x, positions, inv_freq, tokens, heads, head_dim, token_stride,
                            head_stride, stream);
    case FloatType::kBFloat16:
      return rope_qk<__nv_bfloat16>(x, positions, inv_freq, tokens, heads, head_dim, token_stride,
                                    head_stride, stream);
    case FloatType::kFloat16:
      return rope_qk<__half>(x, positions, inv_freq, tokens, heads, head_dim, token_stride,
                             head_stride, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_silu_mul(FloatType type, void* out, const void* gate_up, int64_t rows,
                            int64_t inter, int64_t gate_up_stride, cudaStream_t stream) {
  if (rows == 0 || inter == 0) return cudaSuccess;
  if (rows < 0 || rows > kMaxGridX || inter < 0 ||
      (inter + kSiluThreads - 1) / kSiluThreads > kMaxGridY) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case FloatType::kFloat32:
      return silu_mul<float>(out, gate_up, rows, inter, gate_up_stride, stream);
    case FloatType::kBFloat16:
      return silu_mul<__nv_bfloat16>(out, gate_up, rows, inter, gate_up_stride, stream);
    case FloatType::kFloat16:
      return silu_mul<__half>(out, gate_up, rows, inter, gate_up_stride, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snapserve::kernels::cuda
