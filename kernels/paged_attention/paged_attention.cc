// Checks and device dispatch for paged decode attention; the math lives in
// paged_attention_cpu.cc and paged_attention_cuda.cu.
#include "kernels/paged_attention/paged_attention.h"

#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include "kernels/checks.h"

#ifdef SNAPSERVE_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/paged_attention/paged_attention_cuda.h"
#endif

namespace snapserve::kernels {

namespace {

// Context lengths and block ids decide which memory the kernel reads; on CPU
// they are checked so a bad table fails cleanly instead of reading wild memory.
void check_tables_cpu(const at::Tensor& block_tables, const at::Tensor& context_lens,
                      int64_t num_blocks, int64_t block_size) {
  const int64_t batch = block_tables.size(0);
  const int64_t max_blocks = block_tables.size(1);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t ctx = lens[b];
    TORCH_CHECK(ctx >= 0 && ctx <= max_blocks * block_size, "context_lens[", b, "] = ", ctx,
                " outside [0, ", max_blocks * block_size, "]");
    for (int64_t i = 0; i < (ctx + block_size - 1) / block_size; ++i) {
      const int64_t id = tables[b * max_blocks + i];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block_tables[", b, "][", i, "] = ", id,
                  " outside [0, ", num_blocks, ")");
    }
  }
}

#ifdef SNAPSERVE_HAS_CUDA
cuda::FloatType float_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return cuda::FloatType::kFloat32;
    case at::kBFloat16:
      return cuda::FloatType::kBFloat16;
    default:
      return cuda::FloatType::kFloat16;
  }
}
#endif

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale,
                                  const at::Tensor& key_scales, const at::Tensor& value_scales) {
  check_shape(q, "q", {-1, -1, -1});
  const int64_t batch = q.size(0);
  const int64_t num_heads = q.size(1);
  const int64_t head_dim = q.size(2);
  check_shape(key_cache, "key_cache", {-1, -1, -1, head_dim});
  const int64_t num_blocks = key_cache.size(0);
  const int64_t num_kv_heads = key_cache.size(1);
  const int64_t block_size = key_cache.size(2);
  check_shape(value_cache, "value_cache", {num_blocks, num_kv_heads, block_size, head_dim});
  check_shape(block_tables, "block_tables", {batch, -1});
  check_shape(context_lens, "context_lens", {batch});
  check_float_dtype(q, "q");
  const bool int8 = key_cache.scalar_type() == at::kChar;
  if (int8) {
    // The int8 cache (kernels/kv_append/kv_append.h): CPU, a float32 query, the scales.
    TORCH_CHECK(q.is_cpu() && q.scalar_type() == at::kFloat,
                "paged_decode_attention: an int8 cache is read on CPU by a float32 q");
    TORCH_CHECK(head_dim % 16 == 0, "q: head_dim ", head_dim, " is not a multiple of 16");
    TORCH_CHECK(key_scales.defined() && value_scales.defined(),
                "paged_decode_attention: an int8 cache needs key_scales and value_scales");
    check_shape(key_scales, "key_scales", {num_blocks, num_kv_heads, block_size, head_dim / 16});
    check_shape(value_scales, "value_scales",
                {num_blocks, num_kv_heads, block_size, head_dim / 16});
    TORCH_CHECK(key_scales.scalar_type() == at::kFloat &&
                    value_scales.scalar_type() == at::kFloat && key_scales.is_cpu() &&
                    value_scales.is_cpu() && key_scales.is_contiguous() &&
                    value_scales.is_contiguous(),
                "key_scales/value_scales: expected contiguous float32 CPU tensors");
  } else {
    check_float_dtype(key_cache, "key_cache");
  }
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type(), "value_cache: expected dtype ",
              key_cache.scalar_type());
  // On CPU a float32 query may read a bfloat16/float16 cache (a bfloat16 model
  // computes in float32 there, llama_model.h); otherwise the dtypes match.
  TORCH_CHECK(int8 || key_cache.scalar_type() == q.scalar_type() ||
                  (q.is_cpu() && q.scalar_type() == at::kFloat),
              "key_cache/value_cache: expected dtype ", q.scalar_type());
  TORCH_CHECK(block_tables.scalar_type() == at::kInt, "block_tables: expected int32");
  TORCH_CHECK(context_lens.scalar_type() == at::kInt, "context_lens: expected int32");
  check_same_device(key_cache, "key_cache", q);
  check_same_device(value_cache, "value_cache", q);
  check_same_device(block_tables, "block_tables", q);
  check_same_device(context_lens, "context_lens", q);
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "q: ", num_heads,
              " heads is not a multiple of ", num_kv_heads, " KV heads");
  TORCH_CHECK(block_size > 0, "key_cache: block_size must be positive");
  // The caches are large and written in place elsewhere: never copy them.
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(),
              "key_cache/value_cache: expected contiguous tensors");

  const at::Tensor qc = q.contiguous();
  const at::Tensor tables = block_tables.contiguous();
  const at::Tensor lens = context_lens.contiguous();
  at::Tensor out = at::empty_like(qc);
  if (batch == 0 || num_heads == 0) return out;

  if (q.is_cuda()) {
#ifdef SNAPSERVE_HAS_CUDA
    TORCH_CHECK(head_dim <= cuda::kPagedAttentionMaxHeadDim, "q: head_dim ", head_dim,
                " above the CUDA kernel's limit ", cuda::kPagedAttentionMaxHeadDim);
    const c10::cuda::CUDAGuard guard(q.device());
    const cudaError_t err = cuda::launch_paged_decode_attention(
        float_type(q.scalar_type()), out.data_ptr(), qc.const_data_ptr(),
        key_cache.const_data_ptr(), value_cache.const_data_ptr(), tables.const_data_ptr<int32_t>(),
        lens.const_data_ptr<int32_t>(), static_cast<int>(batch), static_cast<int>(num_heads),
        static_cast<int>(num_kv_heads), static_cast<int>(head_dim), static_cast<int>(block_size),
        static_cast<int>(tables.size(1)), static_cast<float>(scale),
        at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "paged_decode_attention launch: ", cudaGetErrorString(err));
    return out;
#else
    TORCH_CHECK(false, "paged_decode_attention: built without CUDA");
#endif
  }
  TORCH_CHECK(q.is_cpu(), "paged_decode_attention: unsupported device ", q.device());
  check_tables_cpu(tables, lens, num_blocks, block_size);
  cpu::paged_decode_attention(qc, key_cache, value_cache, tables, lens, scale, out, key_scales,
                              value_scales);
  return out;
}

}  // namespace snapserve::kernels
