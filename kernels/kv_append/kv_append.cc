// Checks and device dispatch for KV append; the copies live in
// kv_append_cpu.cc and kv_append_cuda.cu.
#include "kernels/kv_append/kv_append.h"

#include <c10/util/Exception.h>

#include <initializer_list>

#include "kernels/checks.h"

#ifdef SNAPSERVE_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/kv_append/kv_append_cuda.h"
#endif

namespace snapserve::kernels {

namespace {

// t itself where each [.., .., d] row is contiguous (the CPU kernels take any
// token and head strides), else a contiguous copy.
at::Tensor RowsContiguous(const at::Tensor& t) {
  return t.stride(2) == 1 || t.size(2) <= 1 ? t : t.contiguous();
}

}  // namespace

void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping) {
  check_shape(key_cache, "key_cache", {-1, -1, -1, -1});
  const int64_t num_blocks = key_cache.size(0);
  const int64_t num_kv_heads = key_cache.size(1);
  const int64_t block_size = key_cache.size(2);
  const int64_t head_dim = key_cache.size(3);
  check_shape(value_cache, "value_cache", {num_blocks, num_kv_heads, block_size, head_dim});
  check_shape(k, "k", {-1, num_kv_heads, head_dim});
  const int64_t num_tokens = k.size(0);
  check_shape(v, "v", {num_tokens, num_kv_heads, head_dim});
  check_shape(slot_mapping, "slot_mapping", {num_tokens});
  check_float_dtype(key_cache, "key_cache");
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type(), "value_cache: expected dtype ",
              key_cache.scalar_type());
  // float32 rows may go into a 16-bit cache on CPU (rounded on the way).
  const bool rounded_source =
      key_cache.is_cpu() && key_cache.element_size() == 2 && k.scalar_type() == at::kFloat;
  TORCH_CHECK((k.scalar_type() == key_cache.scalar_type() || rounded_source) &&
                  v.scalar_type() == k.scalar_type(),
              "k/v: expected dtype ", key_cache.scalar_type(),
              key_cache.is_cpu() && key_cache.element_size() == 2 ? " or float32" : "", ", got ",
              k.scalar_type(), " and ", v.scalar_type());
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot_mapping: expected int64");
  check_same_device(value_cache, "value_cache", key_cache);
  check_same_device(k, "k", key_cache);
  check_same_device(v, "v", key_cache);
  check_same_device(slot_mapping, "slot_mapping", key_cache);
  // Written in place: a contiguous() copy would silently drop the writes.
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(),
              "key_cache/value_cache: expected contiguous tensors");
  TORCH_CHECK(block_size > 0, "key_cache: block_size must be positive");
  if (num_tokens == 0) return;

  // CPU rows may lie at any token and head strides (kv_append_cpu.cc).
  const at::Tensor kc = key_cache.is_cpu() ? RowsContiguous(k) : k.contiguous();
  const at::Tensor vc = key_cache.is_cpu() ? RowsContiguous(v) : v.contiguous();
  const at::Tensor slots = slot_mapping.contiguous();

  if (key_cache.is_cuda()) {
#ifdef SNAPSERVE_HAS_CUDA
    const c10::cuda::CUDAGuard guard(key_cache.device());
    const cudaError_t err = cuda::launch_kv_append(
        static_cast<int>(key_cache.element_size()), key_cache.data_ptr(), value_cache.data_ptr(),
        kc.const_data_ptr(), vc.const_data_ptr(), slots.const_data_ptr<int64_t>(),
        static_cast<int>(num_tokens), static_cast<int>(num_kv_heads), static_cast<int>(head_dim),
        static_cast<int>(block_size), at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "kv_append launch: ", cudaGetErrorString(err));
    return;
#else
    TORCH_CHECK(false, "kv_append: built without CUDA");
#endif
  }
  TORCH_CHECK(key_cache.is_cpu(), "kv_append: unsupported device ", key_cache.device());
  const int64_t* s = slots.const_data_ptr<int64_t>();
  const int64_t capacity = num_blocks * block_size;
  for (int64_t i = 0; i < num_tokens; ++i) {
    TORCH_CHECK(s[i] < capacity, "slot_mapping[", i, "] = ", s[i], " past the cache (", capacity,
                " slots)");
  }
  cpu::kv_append(key_cache, value_cache, kc, vc, slots);
}

void kv_append_int8(at::Tensor& key_cache, at::Tensor& key_scales, at::Tensor& value_cache,
                    at::Tensor& value_scales, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& slot_mapping) {
  check_shape(key_cache, "key_cache", {-1, -1, -1, -1});
  const int64_t num_blocks = key_cache.size(0);
  const int64_t num_kv_heads = key_cache.size(1);
  const int64_t block_size = key_cache.size(2);
  const int64_t head_dim = key_cache.size(3);
  TORCH_CHECK(head_dim % kKvInt8Group == 0, "key_cache: head_dim ", head_dim,
              " is not a multiple of ", kKvInt8Group);
  check_shape(value_cache, "value_cache", {num_blocks, num_kv_heads, block_size, head_dim});
  const int64_t groups = head_dim / kKvInt8Group;
  check_shape(key_scales, "key_scales", {num_blocks, num_kv_heads, block_size, groups});
  check_shape(value_scales, "value_scales", {num_blocks, num_kv_heads, block_size, groups});
  check_shape(k, "k", {-1, num_kv_heads, head_dim});
  const int64_t num_tokens = k.size(0);
  check_shape(v, "v", {num_tokens, num_kv_heads, head_dim});
  check_shape(slot_mapping, "slot_mapping", {num_tokens});
  TORCH_CHECK(key_cache.scalar_type() == at::kChar && value_cache.scalar_type() == at::kChar,
              "key_cache/value_cache: expected int8");
  TORCH_CHECK(key_scales.scalar_type() == at::kFloat && value_scales.scalar_type() == at::kFloat,
              "key_scales/value_scales: expected float32");
  TORCH_CHECK(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "k/v: expected float32");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot_mapping: expected int64");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{
           &key_cache, &key_scales, &value_cache, &value_scales, &k, &v, &slot_mapping}) {
    TORCH_CHECK(t->is_cpu(), "kv_append_int8: the int8 KV cache is CPU-only");
  }
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() &&
                  key_scales.is_contiguous() && value_scales.is_contiguous(),
              "key_cache/value_cache and their scales: expected contiguous tensors");
  TORCH_CHECK(block_size > 0, "key_cache: block_size must be positive");
  if (num_tokens == 0) return;
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* s = slots.const_data_ptr<int64_t>();
  const int64_t capacity = num_blocks * block_size;
  for (int64_t i = 0; i < num_tokens; ++i) {
    TORCH_CHECK(s[i] < capacity, "slot_mapping[", i, "] = ", s[i], " past the cache (", capacity,
                " slots)");
  }
  cpu::kv_append_int8(key_cache, key_scales, value_cache, value_scales, RowsContiguous(k),
                      RowsContiguous(v), slots);
}

}  // namespace snapserve::kernels
