// snapkv_scores / snapkv_select / snapkv_gather: argument checks and device
// dispatch. The math lives in snapkv_select_cpu.cc and snapkv_select_cuda.cu.
// snapkv_select is snapkv_scores followed by top-k over the pooled scores, on
// either device, so the two always agree.
#include "kernels/snapkv_select/snapkv_select.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/checks.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

#ifdef SNAPSERVE_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/snapkv_select/snapkv_select_cuda.h"
#endif

namespace snapserve::kernels {

namespace {

// What snapkv_scores needs: a valid window and pooling kernel. `fn` names the
// public function in the messages.
void check_score_params(const char* fn, const SnapKvParams& params, int64_t q_rows, int64_t n) {
  TORCH_CHECK(params.window >= 1, fn, ": window must be at least 1, got ", params.window);
  TORCH_CHECK(params.kernel_size >= 1 && params.kernel_size % 2 == 1, fn,
              ": kernel_size must be odd and positive, got ", params.kernel_size);
  TORCH_CHECK(params.window < n, fn, ": window must be less than the prompt length n (",
              params.window, " >= ", n, ")");
  TORCH_CHECK(q_rows == params.window, "q_window: expected ", params.window,
              " rows (the window), got ", q_rows);
}

// snapkv_select also needs w < C < n (the order of the checks is the tests').
void check_select_params(const SnapKvParams& params, int64_t q_rows, int64_t n) {
  TORCH_CHECK(params.window >= 1, "snapkv_select: window must be at least 1, got ", params.window);
  TORCH_CHECK(params.kernel_size >= 1 && params.kernel_size % 2 == 1,
              "snapkv_select: kernel_size must be odd and positive, got ", params.kernel_size);
  TORCH_CHECK(params.window < params.capacity, "snapkv_select: window must be less than capacity (",
              params.window, " >= ", params.capacity, ")");
  TORCH_CHECK(params.capacity < n,
              "snapkv_select: capacity must be less than the prompt length n (", params.capacity,
              " >= ", n, "); keep every entry when n <= capacity");
  check_score_params("snapkv_select", params, q_rows, n);
}

// The tensor checks shared by snapkv_scores and snapkv_select.
void check_inputs(const at::Tensor& q_window, const at::Tensor& keys) {
  check_shape(q_window, "q_window", {-1, -1, -1});
  check_shape(keys, "keys", {-1, -1, -1});
  check_float_dtype(q_window, "q_window");
  check_float_dtype(keys, "keys");
  TORCH_CHECK(keys.scalar_type() == q_window.scalar_type(), "keys: expected dtype ",
              q_window.scalar_type(), " (as q_window), got ", keys.scalar_type());
  check_same_device(keys, "keys", q_window);
  const int64_t num_heads = q_window.size(0);
  const int64_t num_kv_heads = keys.size(0);
  TORCH_CHECK(q_window.size(2) > 0 && keys.size(2) == q_window.size(2),
              "keys: head_dim must equal q_window's (", q_window.size(2), "), got ", keys.size(2));
  TORCH_CHECK(num_kv_heads > 0 && num_heads > 0 && num_heads % num_kv_heads == 0,
              "q_window: num_heads (", num_heads, ") must be a positive multiple of num_kv_heads (",
              num_kv_heads, ")");
  // Positions travel as 32-bit values inside the rank keys and CUDA indices.
  TORCH_CHECK(keys.size(1) <= std::numeric_limits<int32_t>::max(), "keys: prompt length ",
              keys.size(1), " exceeds 2^31 - 1");
}

#ifdef SNAPSERVE_HAS_CUDA
void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": CUDA launch failed: ", cudaGetErrorString(err));
}

SnapKvScores snapkv_scores_cuda(const at::Tensor& q_window, const at::Tensor& keys,
                                const SnapKvParams& params) {
  const c10::cuda::CUDAGuard guard(q_window.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const int64_t num_heads = q_window.size(0);
  const int64_t w = q_window.size(1);
  const int64_t d = q_window.size(2);
  const int64_t num_kv_heads = keys.size(0);
  const int64_t n = keys.size(1);
  const int64_t prefix = n - w;
  TORCH_CHECK(d <= 8192, "q_window: head_dim ", d, " exceeds the CUDA kernel's limit (8192)");
  TORCH_CHECK(num_kv_heads <= 65535, "keys: more KV heads (", num_kv_heads,
              ") than the CUDA grid allows (65535)");

  const at::Tensor q = q_window.to(at::kFloat).contiguous();
  const at::Tensor keys_t = keys.to(at::kFloat).transpose(1, 2).contiguous();  // [Hkv, d, n]
  // Scratch from the caching allocator: no sync, freed when the stream is done.
  at::Tensor probs = at::empty({num_heads, w, n}, q.options());
  SnapKvScores scores{at::empty({num_kv_heads, prefix}, q.options()),
                      at::empty({num_kv_heads, prefix}, q.options())};

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  check_launch(cuda::launch_snapkv_softmax(q.data_ptr<float>(), keys_t.data_ptr<float>(),
                                           probs.data_ptr<float>(), num_heads, num_kv_heads, w, n,
                                           d, scale, stream),
               "snapkv_scores (softmax)");
  check_launch(cuda::launch_snapkv_group_scores(
                   probs.data_ptr<float>(), scores.raw.data_ptr<float>(), num_heads, num_kv_heads,
                   w, n, params.group_reduce == GroupReduce::kMax, stream),
               "snapkv_scores (group scores)");
  check_launch(cuda::launch_snapkv_pool(
                   scores.raw.data_ptr<float>(), scores.pooled.data_ptr<float>(), num_kv_heads,
                   prefix, params.kernel_size, params.pooling == PoolingKind::kAvg, stream),
               "snapkv_scores (pool)");
  return scores;
}

at::Tensor snapkv_topk_cuda(const at::Tensor& pooled, int64_t top, int64_t w) {
  const c10::cuda::CUDAGuard guard(pooled.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const int64_t num_kv_heads = pooled.size(0);
  at::Tensor out = at::empty({num_kv_heads, top + w}, pooled.options().dtype(at::kLong));
  check_launch(cuda::launch_snapkv_topk(pooled.data_ptr<float>(), out.data_ptr<int64_t>(),
                                        num_kv_heads, pooled.size(1), top, w, stream),
               "snapkv_select (top-k)");
  return out;
}

at::Tensor snapkv_gather_cuda(const at::Tensor& src_in, const at::Tensor& indices_in) {
  const c10::cuda::CUDAGuard guard(src_in.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const at::Tensor src = src_in.stride(2) == 1 ? src_in : src_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  TORCH_CHECK(src.size(0) <= 65535, "src: more KV heads (", src.size(0),
              ") than the CUDA grid allows (65535)");
  at::Tensor out = at::empty({src.size(0), indices.size(1), src.size(2)}, src.options());
  if (out.numel() == 0) return out;
  check_launch(cuda::launch_snapkv_gather(src.data_ptr(), src.stride(0), src.stride(1),
                                          indices.data_ptr<int64_t>(), out.data_ptr(), src.size(0),
                                          src.size(1), indices.size(1), src.size(2),
                                          static_cast<int64_t>(src.element_size()), stream),
               "snapkv_gather");
  return out;
}
#endif  // SNAPSERVE_HAS_CUDA

}  // namespace

namespace {

// Scores of checked inputs on their device.
SnapKvScores scores_on_device(const char* fn, const at::Tensor& q_window, const at::Tensor& keys,
                              const SnapKvParams& params) {
  if (q_window.is_cpu()) return detail::snapkv_scores_cpu(q_window, keys, params);
#ifdef SNAPSERVE_HAS_CUDA
  if (q_window.is_cuda()) return snapkv_scores_cuda(q_window, keys, params);
#endif
  TORCH_CHECK(false, fn, ": unsupported device ", q_window.device());
}

}  // namespace

SnapKvScores snapkv_scores(const at::Tensor& q_window, const at::Tensor& keys,
                           const SnapKvParams& params) {
  check_inputs(q_window, keys);
  check_score_params("snapkv_scores", params, q_window.size(1), keys.size(1));
  return scores_on_device("snapkv_scores", q_window, keys, params);
}

at::Tensor snapkv_topk(const at::Tensor& pooled, const SnapKvParams& params) {
  check_shape(pooled, "pooled", {-1, -1});
  TORCH_CHECK(pooled.scalar_type() == at::kFloat, "pooled: expected float32, got ",
              pooled.scalar_type());
  TORCH_CHECK(pooled.size(0) > 0, "pooled: expected at least one KV head");
  const int64_t n = pooled.size(1) + params.window;
  TORCH_CHECK(params.window >= 1, "snapkv_topk: window must be at least 1, got ", params.window);
  TORCH_CHECK(params.window < params.capacity, "snapkv_topk: window must be less than capacity (",
              params.window, " >= ", params.capacity, ")");
  TORCH_CHECK(params.capacity < n, "snapkv_topk: capacity must be less than the prompt length n (",
              params.capacity, " >= ", n, ")");
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(), "pooled: prompt length ", n,
              " exceeds 2^31 - 1");
  const int64_t top = params.capacity - params.window;
  if (pooled.is_cpu()) return detail::snapkv_topk_cpu(pooled, top, params.window);
#ifdef SNAPSERVE_HAS_CUDA
  if (pooled.is_cuda()) return snapkv_topk_cuda(pooled.contiguous(), top, params.window);
#endif
  TORCH_CHECK(false, "snapkv_topk: unsupported device ", pooled.device());
}

at::Tensor snapkv_select(const at::Tensor& q_window, const at::Tensor& keys,
                         const SnapKvParams& params) {
  check_inputs(q_window, keys);
  check_select_params(params, q_window.size(1), keys.size(1));
  return snapkv_topk(scores_on_device("snapkv_select", q_window, keys, params).pooled, params);
}

at::Tensor snapkv_gather(const at::Tensor& src, const at::Tensor& indices) {
  check_shape(src, "src", {-1, -1, -1});
  check_shape(indices, "indices", {src.size(0), -1});
  TORCH_CHECK(indices.scalar_type() == at::kLong, "indices: expected int64, got ",
              indices.scalar_type());
  check_same_device(indices, "indices", src);
  if (src.is_cpu()) return detail::snapkv_gather_cpu(src, indices);
#ifdef SNAPSERVE_HAS_CUDA
  if (src.is_cuda()) return snapkv_gather_cuda(src, indices);
#endif
  TORCH_CHECK(false, "snapkv_gather: unsupported device ", src.device());
}

}  // namespace snapserve::kernels
