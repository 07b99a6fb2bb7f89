// CUDA KV append: one thread block per new token; its threads copy the
// token's num_kv_heads * head_dim elements of K and V into the slot's block.
#include <cstdint>

#include "kernels/kv_append/kv_append_cuda.h"

namespace snapserve::kernels::cuda {

namespace {

template <typename T>
__global__ void kv_append_kernel(
    T* __restrict__ key_cache,                 // [num_blocks, num_kv_heads, block_size, head_dim]
    T* __restrict__ value_cache,               // [num_blocks, num_kv_heads, block_size, head_dim]
    const T* __restrict__ k,                   // [num_tokens, num_kv_heads, head_dim]
    const T* __restrict__ v,                   // [num_tokens, num_kv_heads, head_dim]
    const int64_t* __restrict__ slot_mapping,  // [num_tokens]
    int num_kv_heads, int head_dim, int block_size) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding token
  const int64_t block = slot / block_size;
  const int64_t offset = slot % block_size;
  const int row = num_kv_heads * head_dim;
  for (int i = threadIdx.x; i < row; i += blockDim.x) {
    const int64_t head = i / head_dim;
    const int64_t j = i % head_dim;
    const int64_t dst = ((block * num_kv_heads + head) * block_size + offset) * head_dim + j;
    key_cache[dst] = k[token * row + i];
    value_cache[dst] = v[token * row + i];
  }
}

template <typename T>
cudaError_t launch(void* key_cache, void* value_cache, const void* k, const void* v,
                   const int64_t* slot_mapping, int num_tokens, int num_kv_heads, int head_dim,
                   int block_size, cudaStream_t stream) {
  if (num_tokens == 0 || num_kv_heads * head_dim == 0) return cudaSuccess;
  const int row = num_kv_heads * head_dim;
  const int threads = row < 256 ? ((row + 31) / 32) * 32 : 256;
  kv_append_kernel<T><<<num_tokens, threads, 0, stream>>>(
      static_cast<T*>(key_cache), static_cast<T*>(value_cache), static_cast<const T*>(k),
      static_cast<const T*>(v), slot_mapping, num_kv_heads, head_dim, block_size);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_kv_append(int elem_size, void* key_cache, void* value_cache, const void* k,
                             const void* v, const int64_t* slot_mapping, int num_tokens,
                             int num_kv_heads, int head_dim, int block_size, cudaStream_t stream) {
  switch (elem_size) {
    case 2:
      return launch<uint16_t>(key_cache, value_cache, k, v, slot_mapping, num_tokens, num_kv_heads,
                              head_dim, block_size, stream);
    case 4:
      return launch<uint32_t>(key_cache, value_cache, k, v, slot_mapping, num_tokens, num_kv_heads,
                              head_dim, block_size, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace snapserve::kernels::cuda
