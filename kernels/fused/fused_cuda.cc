// Checks and launches of the fused CUDA kernels (kernels/fused/fused_cuda.h).
#include "kernels/fused/fused_cuda.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/checks.h"

#ifdef SNAPSERVE_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/fused/fused_rowwise_cuda.h"
#include "kernels/kv_append/kv_append_lanes_cuda.h"
#include "kernels/paged_attention/split_decode_attention_cuda.h"
#endif

namespace snapserve::kernels {

#ifdef SNAPSERVE_HAS_CUDA

namespace {

cuda::FloatType float_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return cuda::FloatType::kFloat32;
    case at::kBFloat16:
      return cuda::FloatType::kBFloat16;
    case at::kHalf:
      return cuda::FloatType::kFloat16;
    default:
      break;
  }
  TORCH_CHECK(false, "expected float32, bfloat16 or float16, got ", t.scalar_type());
  return cuda::FloatType::kFloat32;
}

void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.defined() && t.is_cuda(), name, ": expected a CUDA tensor");
  check_same_device(t, name, like);
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": CUDA launch failed: ", cudaGetErrorString(err));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool cuda_fused_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("SNAPSERVE_CUDA_FUSED");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

void rms_norm_add_cuda_(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                        double eps, at::Tensor& out) {
  check_shape(residual, "residual", {-1, -1});
  const int64_t rows = residual.size(0), n = residual.size(1);
  check_cuda(residual, "residual", residual);
  TORCH_CHECK(residual.scalar_type() == at::kFloat, "residual: expected float32");
  TORCH_CHECK(residual.stride(1) == 1 || n <= 1, "residual: expected contiguous rows");
  check_shape(weight, "weight", {n});
  check_cuda(weight, "weight", residual);
  check_float_dtype(weight, "weight");
  TORCH_CHECK(weight.is_contiguous(), "weight: expected a contiguous tensor");
  check_shape(out, "out", {rows, n});
  check_cuda(out, "out", residual);
  TORCH_CHECK(out.scalar_type() == weight.scalar_type() && out.is_contiguous(),
              "out: expected a contiguous ", weight.scalar_type(), " tensor");
  if (delta.defined()) {
    check_shape(delta, "delta", {rows, n});
    check_cuda(delta, "delta", residual);
    TORCH_CHECK(delta.scalar_type() == weight.scalar_type(), "delta: expected dtype ",
                weight.scalar_type());
    TORCH_CHECK(delta.stride(1) == 1 || n <= 1, "delta: expected contiguous rows");
  }
  const c10::cuda::CUDAGuard guard(residual.device());
  check_launch(cuda::launch_rms_norm_add(float_type(weight), residual.data_ptr<float>(),
                                         delta.defined() ? delta.const_data_ptr() : nullptr,
                                         weight.const_data_ptr(), out.data_ptr(), rows, n,
                                         residual.stride(0), delta.defined() ? delta.stride(0) : 0,
                                         static_cast<float>(eps), at::cuda::getCurrentCUDAStream()),
               "rms_norm_add");
}

void rope_qk_cuda_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq) {
  check_shape(x, "x", {-1, -1, -1});
  const int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
  check_cuda(x, "x", x);
  check_float_dtype(x, "x");
  TORCH_CHECK(x.stride(2) == 1, "x: expected a contiguous last dimension");
  TORCH_CHECK(head_dim % 2 == 0 && head_dim <= cuda::kRopeMaxHeadDim, "x: head_dim ", head_dim,
              " must be even and at most ", cuda::kRopeMaxHeadDim);
  check_shape(positions, "positions", {tokens});
  check_cuda(positions, "positions", x);
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "positions: expected contiguous int64");
  check_shape(inv_freq, "inv_freq", {head_dim / 2});
  check_cuda(inv_freq, "inv_freq", x);
  TORCH_CHECK(inv_freq.scalar_type() == at::kFloat && inv_freq.is_contiguous(),
              "inv_freq: expected contiguous float32");
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(
      cuda::launch_rope_qk(float_type(x), x.data_ptr(), positions.const_data_ptr<int64_t>(),
                           inv_freq.const_data_ptr<float>(), tokens, heads, head_dim, x.stride(0),
                           x.stride(1), at::cuda::getCurrentCUDAStream()),
      "rope_qk");
}

void silu_mul_cuda_out(const at::Tensor& gate_up, at::Tensor& out) {
  check_shape(gate_up, "gate_up", {-1, -1});
  const int64_t rows = gate_up.size(0);
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up: expected an even number of columns");
  const int64_t inter = gate_up.size(1) / 2;
  check_cuda(gate_up, "gate_up", gate_up);
  check_float_dtype(gate_up, "gate_up");
  TORCH_CHECK(gate_up.stride(1) == 1 || inter == 0, "gate_up: expected contiguous rows");
  check_shape(out, "out", {rows, inter});
  check_cuda(out, "out", gate_up);
  TORCH_CHECK(out.scalar_type() == gate_up.scalar_type() && out.is_contiguous(),
              "out: expected a contiguous ", gate_up.scalar_type(), " tensor");
  const c10::cuda::CUDAGuard guard(gate_up.device());
  check_launch(
      cuda::launch_silu_mul(float_type(gate_up), out.data_ptr(), gate_up.const_data_ptr(), rows,
                            inter, gate_up.stride(0), at::cuda::getCurrentCUDAStream()),
      "silu_mul");
}

void kv_append_lanes_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& slots) {
  check_shape(key_cache, "key_cache", {-1, 1, -1, -1});
  const int64_t head_dim = key_cache.size(3);
  check_shape(value_cache, "value_cache", {key_cache.size(0), 1, key_cache.size(2), head_dim});
  check_shape(k, "k", {-1, -1, head_dim});
  const int64_t tokens = k.size(0), lanes = k.size(1);
  check_shape(v, "v", {tokens, lanes, head_dim});
  check_shape(slots, "slots", {tokens, lanes});
  check_cuda(key_cache, "key_cache", key_cache);
  check_cuda(value_cache, "value_cache", key_cache);
  check_cuda(k, "k", key_cache);
  check_cuda(v, "v", key_cache);
  check_cuda(slots, "slots", key_cache);
  check_float_dtype(key_cache, "key_cache");
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type() &&
                  k.scalar_type() == key_cache.scalar_type() &&
                  v.scalar_type() == key_cache.scalar_type(),
              "value_cache, k, v: expected dtype ", key_cache.scalar_type());
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(),
              "key_cache/value_cache: expected contiguous tensors");
  TORCH_CHECK(k.strides() == v.strides() && (k.stride(2) == 1 || head_dim <= 1),
              "k, v: expected equal strides and contiguous rows");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous(),
              "slots: expected contiguous int64");
  const c10::cuda::CUDAGuard guard(key_cache.device());
  check_launch(
      cuda::launch_kv_append_lanes(static_cast<int>(key_cache.element_size()), key_cache.data_ptr(),
                                   value_cache.data_ptr(), k.const_data_ptr(), v.const_data_ptr(),
                                   slots.const_data_ptr<int64_t>(), tokens, lanes, head_dim,
                                   k.stride(0), k.stride(1), at::cuda::getCurrentCUDAStream()),
      "kv_append_lanes");
}

bool split_decode_attention_supported(const at::Tensor& q, const at::Tensor& key_cache,
                                      const at::Tensor& value_cache) {
  return q.is_cuda() && q.dim() == 3 && key_cache.dim() == 4 &&
         cuda::split_decode_supports(q.size(1), key_cache.size(1), q.size(2)) &&
         q.is_contiguous() && key_cache.is_contiguous() && value_cache.is_contiguous() &&
         aligned16(q.const_data_ptr()) && aligned16(key_cache.const_data_ptr()) &&
         aligned16(value_cache.const_data_ptr());
}

int64_t split_decode_attention_cuda(at::Tensor& out, const at::Tensor& q,
                                    const at::Tensor& key_cache, const at::Tensor& value_cache,
                                    const at::Tensor& block_tables, const at::Tensor& context_lens,
                                    double scale, int64_t partition_size) {
  check_shape(q, "q", {-1, -1, -1});
  const int64_t batch = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  check_shape(key_cache, "key_cache", {-1, -1, -1, head_dim});
  const int64_t num_blocks = key_cache.size(0), num_kv_heads = key_cache.size(1);
  const int64_t block_size = key_cache.size(2);
  check_shape(value_cache, "value_cache", {num_blocks, num_kv_heads, block_size, head_dim});
  check_shape(block_tables, "block_tables", {batch, -1});
  check_shape(context_lens, "context_lens", {batch});
  check_shape(out, "out", {batch, num_heads, head_dim});
  check_cuda(q, "q", q);
  check_cuda(key_cache, "key_cache", q);
  check_cuda(value_cache, "value_cache", q);
  check_cuda(block_tables, "block_tables", q);
  check_cuda(context_lens, "context_lens", q);
  check_cuda(out, "out", q);
  check_float_dtype(q, "q");
  TORCH_CHECK(key_cache.scalar_type() == q.scalar_type() &&
                  value_cache.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "key_cache, value_cache, out: expected dtype ", q.scalar_type());
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous() &&
                  context_lens.scalar_type() == at::kInt && context_lens.is_contiguous(),
              "block_tables/context_lens: expected contiguous int32 tensors");
  TORCH_CHECK(out.is_contiguous(), "out: expected a contiguous tensor");
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "q: ", num_heads,
              " heads is not a multiple of ", num_kv_heads, " KV heads");
  TORCH_CHECK(block_size > 0, "key_cache: block_size must be positive");
  TORCH_CHECK(split_decode_attention_supported(q, key_cache, value_cache),
              "split_decode_attention: needs head_dim a multiple of ",
              cuda::kSplitDecodeHeadDimMultiple, " up to ", cuda::kSplitDecodeMaxHeadDim,
              " and contiguous, 16-byte aligned q and caches");
  TORCH_CHECK(aligned16(out.const_data_ptr()), "out: expected 16-byte alignment");
  TORCH_CHECK(partition_size == 0 || (partition_size >= cuda::kSplitDecodeMinPartition &&
                                      partition_size <= cuda::kSplitDecodeMaxPartition &&
                                      (partition_size & (partition_size - 1)) == 0),
              "partition_size: expected 0 or a power of two in [", cuda::kSplitDecodeMinPartition,
              ", ", cuda::kSplitDecodeMaxPartition, "], got ", partition_size);
  if (batch == 0 || num_heads == 0) return 0;

  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t max_blocks = block_tables.size(1);
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cuda::SplitDecodePlan plan =
      cuda::plan_split_decode(batch, num_heads, num_kv_heads, head_dim, max_blocks * block_size,
                              num_sms, static_cast<int>(partition_size));
  TORCH_CHECK(plan.num_splits > 0, "split_decode_attention: a context of ", max_blocks * block_size,
              " entries exceeds ", cuda::kSplitDecodeMaxSplits, " partitions");
  at::Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = at::empty({plan.workspace_bytes}, q.options().dtype(at::kByte));
  }
  check_launch(
      cuda::launch_split_decode_attention(
          float_type(q), plan, out.data_ptr(), q.const_data_ptr(), key_cache.const_data_ptr(),
          value_cache.const_data_ptr(), block_tables.const_data_ptr<int32_t>(),
          context_lens.const_data_ptr<int32_t>(), batch, num_heads, num_kv_heads, head_dim,
          block_size, max_blocks, static_cast<float>(scale),
          workspace.defined() ? workspace.data_ptr() : nullptr, at::cuda::getCurrentCUDAStream()),
      "split_decode_attention");
  return plan.num_splits;
}

#else  // no CUDA in this build

namespace {
[[noreturn]] void no_cuda(const char* op) {
  TORCH_CHECK(false, op, ": this build has no CUDA kernels");
}
}  // namespace

bool cuda_fused_enabled() { return false; }

void rms_norm_add_cuda_(at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::Tensor&) {
  no_cuda("rms_norm_add");
}
void rope_qk_cuda_(at::Tensor&, const at::Tensor&, const at::Tensor&) { no_cuda("rope_qk"); }
void silu_mul_cuda_out(const at::Tensor&, at::Tensor&) { no_cuda("silu_mul"); }
void kv_append_lanes_cuda(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&) {
  no_cuda("kv_append_lanes");
}
bool split_decode_attention_supported(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  return false;
}
int64_t split_decode_attention_cuda(at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                    int64_t) {
  no_cuda("split_decode_attention");
}

#endif

}  // namespace snapserve::kernels
