// Launchers of the SnapKV CUDA kernels (snapkv_select_cuda.cu). Raw pointers
// and sizes only, no LibTorch types, so the .cu compiles without ATen headers.
// kernels/snapkv_select/snapkv_select.cc checks the tensors, converts them to float32,
// allocates the scratch buffers and calls these in order on one stream:
// snapkv_scores runs softmax, group scores (its `raw` output) and pool (its
// `pooled` output); snapkv_select runs those three, then top-k. Each
// launcher enqueues work on `stream`, never synchronizes, and returns the
// launch error (cudaGetLastError) for the caller to report.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace snapserve::kernels::cuda {

// Steps 3-4, first half: each window row's causal softmax over the n keys.
//   q:      [num_heads, w, d]      float32, contiguous
//   keys_t: [num_kv_heads, d, n]   float32, contiguous (Kᵀ per KV head)
//   probs:  [num_heads, w, n]      float32 out; row i holds softmax over keys 0 .. n-w+i,
//                                  the columns after that are left unwritten
cudaError_t launch_snapkv_softmax(const float* q, const float* keys_t, float* probs,
                                  int64_t num_heads, int64_t num_kv_heads, int64_t w, int64_t n,
                                  int64_t d, float scale, cudaStream_t stream);

// Steps 4 (sum over window rows, prefix columns) and 5 (group reduce).
//   probs:   [num_heads, w, n]           float32
//   reduced: [num_kv_heads, n - w]       float32 out (snapkv_scores' `raw`)
cudaError_t launch_snapkv_group_scores(const float* probs, float* reduced, int64_t num_heads,
                                       int64_t num_kv_heads, int64_t w, int64_t n, bool group_max,
                                       cudaStream_t stream);

// Step 6: stride-1 pooling with padding k/2 (avg divides by k).
//   reduced: [num_kv_heads, len]  ->  pooled: [num_kv_heads, len] (snapkv_scores' `pooled`)
cudaError_t launch_snapkv_pool(const float* reduced, float* pooled, int64_t num_kv_heads,
                               int64_t len, int64_t kernel_size, bool avg, cudaStream_t stream);

// Step 7: per KV head, the `top` best prefix positions (ties: lower position)
// in increasing order, then the w window positions len .. len+w-1.
//   pooled: [num_kv_heads, len]        float32
//   out:    [num_kv_heads, top + w]    int64 out
cudaError_t launch_snapkv_topk(const float* pooled, int64_t* out, int64_t num_kv_heads, int64_t len,
                               int64_t top, int64_t w, cudaStream_t stream);

// Gather of kept rows: out[g, c, :] = src[g, indices[g, c], :]; an index outside
// [0, n) writes a zero row.
//   src:     [num_kv_heads, n, d]  elem_size-byte elements, strides in elements
//                                  (head_stride, pos_stride, 1)
//   indices: [num_kv_heads, kept]  int64, contiguous
//   out:     [num_kv_heads, kept, d] contiguous
cudaError_t launch_snapkv_gather(const void* src, int64_t head_stride, int64_t pos_stride,
                                 const int64_t* indices, void* out, int64_t num_kv_heads, int64_t n,
                                 int64_t kept, int64_t d, int64_t elem_size, cudaStream_t stream);

}  // namespace snapserve::kernels::cuda
