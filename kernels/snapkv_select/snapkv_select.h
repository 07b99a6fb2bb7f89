// SnapKV selection (docs/snapkv.md): the per-position scores (snapkv_scores),
// which prompt positions each KV head keeps (snapkv_select = scores + top-k),
// and the gather that copies them out. Owns the math of steps 2-7 only; it
// never sees a request, a block table or a layer index (the compress policy
// and the KV cache decide when and where the kept entries go).
//
// This header is deliberately light: it forward-declares at::Tensor (and
// SnapKvScores, defined in kernels/snapkv_select/snapkv_select_scores.h) instead of including
// ATen, so engine/compress/compression_policy.h (which the request path includes for
// the enums) stays free of LibTorch headers. Callers of the functions include
// <ATen/core/Tensor.h> themselves; callers of snapkv_scores include
// kernels/snapkv_select/snapkv_select_scores.h.
#pragma once

#include <cstdint>

namespace at {
class Tensor;
}  // namespace at

namespace snapserve::kernels {

// {at::Tensor raw, pooled}: defined in kernels/snapkv_select/snapkv_select_scores.h, which
// includes ATen; see snapkv_scores below.
struct SnapKvScores;

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

// Steps 2-6 without the selection: the scores snapkv_select ranks.
//   q_window, keys: as snapkv_select below (same checks, same dtypes/devices)
//   returns {raw, pooled}, both float32 [num_kv_heads, n - window], contiguous,
//   on the inputs' device:
//     raw[g][j]    = s_g[j] (steps 3-5): for each query head of KV head g, the
//                    causal softmax (float32, 1/sqrt(d) scaling) of every window
//                    row, summed over the `window` rows at prefix position j, then
//                    reduced over the GQA group (params.group_reduce: mean or
//                    max). With mean, raw[g] sums to at most `window` over j and
//                    is the window's attention mass on the prefix.
//     pooled[g][j] = p_g[j] (step 6): raw[g] pooled with params.kernel_size and
//                    params.pooling (kernel_size 1: equal to raw).
// Only prefix positions 0 .. n-window-1 are scored; the window itself is
// always kept by the selection and has no score. params.capacity is not used
// (any value is accepted); 1 <= window < n is required. The values are exactly
// those snapkv_select ranks on the same device and CPU instruction set (it is
// this function followed by top-k over `pooled`). On CUDA the call is
// asynchronous on the current stream.
SnapKvScores snapkv_scores(const at::Tensor& q_window, const at::Tensor& keys,
                           const SnapKvParams& params);

// Step 7 alone: the positions snapkv_select keeps, from scores already computed.
//   pooled:  [num_kv_heads, n - window] float32 (snapkv_scores(...).pooled)
//   returns  [num_kv_heads, capacity] int64, as snapkv_select
// Needs 1 <= window < capacity < n (n = pooled.size(1) + window); kernel_size,
// pooling and group_reduce are not used. For callers that need the scores as
// well as the selection (engine/compress/snapkv_selector.cc) without scoring
// twice: snapkv_select(q, k, p) == snapkv_topk(snapkv_scores(q, k, p).pooled, p).
at::Tensor snapkv_topk(const at::Tensor& pooled, const SnapKvParams& params);

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
// n <= capacity (step 1). The ranking is top-k over snapkv_scores(...).pooled
// (step 7): ties keep the lower position; NaN scores rank below every number.
// On CUDA the call is asynchronous on the current stream.
at::Tensor snapkv_select(const at::Tensor& q_window, const at::Tensor& keys,
                         const SnapKvParams& params);

// Copies the kept entries out of one layer's full K or V:
//   src:     [num_kv_heads, n, head_dim]  any dtype, any strides
//   indices: [num_kv_heads, C] int64      positions in [0, n) (from snapkv_select)
//   returns  [num_kv_heads, C, head_dim]  contiguous, same dtype and device as src
// The CPU path checks the index values; the CUDA path cannot without a sync, so
// an out-of-range index yields a zero row there instead of a stray read.
at::Tensor snapkv_gather(const at::Tensor& src, const at::Tensor& indices);

// Device implementations, called by the functions above after every
// argument has been checked. Not for other callers.
namespace detail {
SnapKvScores snapkv_scores_cpu(const at::Tensor& q_window, const at::Tensor& keys,
                               const SnapKvParams& params);
// Step 7 on CPU: pooled [num_kv_heads, len] float32 -> [num_kv_heads, top + w] int64.
at::Tensor snapkv_topk_cpu(const at::Tensor& pooled, int64_t top, int64_t w);
at::Tensor snapkv_gather_cpu(const at::Tensor& src, const at::Tensor& indices);
}  // namespace detail

}  // namespace snapserve::kernels
