// SnapKV selection (docs/snapkv.md): which prompt positions each KV head keeps,
// and the gather that copies them out. Owns the math of steps 2-7 only; it
// never sees a request, a block table or a layer index (the compress policy
// and the KV cache decide when and where the kept entries go).
//
// This header is deliberately light: it forward-declares at::Tensor instead of
// including ATen, so engine/compress/snapkv_policy.h (which the request path
// includes for the enums) stays free of LibTorch headers. Callers of the
// functions include <ATen/core/Tensor.h> themselves.
#pragma once

#include <cstdint>

namespace at {
class Tensor;
}  // namespace at

namespace snapserve::kernels {

// Step 6: how the per-position scores are smoothed before top-k.
enum class PoolingKind { kMax, kAvg };

// Step 5: how the query heads that share one KV head (a GQA group) are
// combined. Mean is the default (as kvpress); max is the alternative.
enum class GroupReduce { kMean, kMax };

struct SnapKvParams {
  int64_t window;       // w: observation window, 1 <= w < capacity
  int64_t capacity;     // C: entries kept per KV head, window included; C < n
  int64_t kernel_size;  // k: odd pooling kernel (1 = no pooling)
  PoolingKind pooling;
  GroupReduce group_reduce = GroupReduce::kMean;
};

// Shape contract:
//   q_window: [num_heads, window, head_dim]   post-RoPE queries of the last `window`
//                                             prompt positions
//   keys:     [num_kv_heads, n, head_dim]     post-RoPE keys of all n prompt positions
//   returns   [num_kv_heads, capacity] int64  kept positions, strictly increasing per
//                                             row; the last `window` are n-w .. n-1
// num_heads must be a multiple of num_kv_heads; query heads h in
// [g*G, (g+1)*G) with G = num_heads / num_kv_heads share KV head g (as
// transformers' repeat_kv). q_window and keys share dtype (float32, bfloat16 or
// float16) and device (CPU or CUDA); scores are computed in float32 whatever the
// input dtype. n > capacity is required: the caller keeps everything when
// n <= capacity (step 1). Ties in the pooled score keep the lower position;
// NaN scores rank below every number. On CUDA the call is asynchronous on the
// current stream.
at::Tensor snapkv_select(const at::Tensor& q_window, const at::Tensor& keys,
                         const SnapKvParams& params);

// Copies the kept entries out of one layer's full K or V:
//   src:     [num_kv_heads, n, head_dim]  any dtype, any strides
//   indices: [num_kv_heads, C] int64      positions in [0, n) (from snapkv_select)
//   returns  [num_kv_heads, C, head_dim]  contiguous, same dtype and device as src
// The CPU path checks the index values; the CUDA path cannot without a sync, so
// an out-of-range index yields a zero row there instead of a stray read.
at::Tensor snapkv_gather(const at::Tensor& src, const at::Tensor& indices);

// Device implementations, called by the two functions above after every
// argument has been checked. Not for other callers.
namespace detail {
at::Tensor snapkv_select_cpu(const at::Tensor& q_window, const at::Tensor& keys,
                             const SnapKvParams& params);
at::Tensor snapkv_gather_cpu(const at::Tensor& src, const at::Tensor& indices);
}  // namespace detail

}  // namespace snapserve::kernels
