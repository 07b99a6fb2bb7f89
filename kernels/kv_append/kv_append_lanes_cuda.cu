// CUDA KV append into the cache's lanes (contract in kv_append_lanes_cuda.h):
// one warp per (token, lane) row. Rows move 16 bytes per load and store when
// every address and stride allows it, else one element at a time.
#include <cstdint>

#include "kernels/kv_append/kv_append_lanes_cuda.h"

namespace snapserve::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

// `Unit` is the copied word: uint4 (16 bytes) or the element itself. Strides
// and head_units count Units.
template <typename Unit>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    kv_append_lanes_kernel(Unit* __restrict__ key_cache,    // [num_slots, head_units]
                           Unit* __restrict__ value_cache,  // [num_slots, head_units]
                           const Unit* __restrict__ k,      // [tokens, lanes, head_units], strided
                           const Unit* __restrict__ v,      // [tokens, lanes, head_units], strided
                           const int64_t* __restrict__ slots,  // [tokens, lanes]
                           int64_t rows, int64_t lanes, int64_t head_units, int64_t token_stride,
                           int64_t lane_stride) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t slot = slots[row];
  if (slot < 0) return;  // padding
  const int64_t token = row / lanes;
  const int64_t lane = row % lanes;
  const int64_t src = token * token_stride + lane * lane_stride;
  const int64_t dst = slot * head_units;
  for (int64_t i = threadIdx.x % 32; i < head_units; i += 32) {
    key_cache[dst + i] = k[src + i];
    value_cache[dst + i] = v[src + i];
  }
}

template <typename Unit>
cudaError_t launch(void* key_cache, void* value_cache, const void* k, const void* v,
                   const int64_t* slots, int64_t rows, int64_t lanes, int64_t head_units,
                   int64_t token_stride, int64_t lane_stride, cudaStream_t stream) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 2147483647) return cudaErrorInvalidValue;
  kv_append_lanes_kernel<Unit><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<Unit*>(key_cache), static_cast<Unit*>(value_cache), static_cast<const Unit*>(k),
      static_cast<const Unit*>(v), slots, rows, lanes, head_units, token_stride, lane_stride);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t launch_kv_append_lanes(int elem_size, void* key_cache, void* value_cache, const void* k,
                                   const void* v, const int64_t* slots, int64_t tokens,
                                   int64_t lanes, int64_t head_dim, int64_t token_stride,
                                   int64_t lane_stride, cudaStream_t stream) {
  if (elem_size != 2 && elem_size != 4) return cudaErrorInvalidValue;
  const int64_t rows = tokens * lanes;
  if (rows == 0 || head_dim == 0) return cudaSuccess;
  // 16-byte words when the row, both strides and every base pointer are
  // whole words; `per` elements to a word.
  const int64_t per = 16 / elem_size;
  const bool words = head_dim % per == 0 && token_stride % per == 0 && lane_stride % per == 0 &&
                     aligned16(key_cache) && aligned16(value_cache) && aligned16(k) && aligned16(v);
  if (words) {
    return launch<uint4>(key_cache, value_cache, k, v, slots, rows, lanes, head_dim / per,
                         token_stride / per, lane_stride / per, stream);
  }
  if (elem_size == 2) {
    return launch<uint16_t>(key_cache, value_cache, k, v, slots, rows, lanes, head_dim,
                            token_stride, lane_stride, stream);
  }
  return launch<uint32_t>(key_cache, value_cache, k, v, slots, rows, lanes, head_dim, token_stride,
                          lane_stride, stream);
}

}  // namespace snapserve::kernels::cuda
