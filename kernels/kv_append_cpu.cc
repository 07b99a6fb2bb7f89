// CPU KV append: each (token, KV head) row is one contiguous head_dim copy.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstring>

#include "kernels/kv_append.h"

namespace snapserve::kernels::cpu {

void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping) {
  const int64_t num_tokens = k.size(0);
  const int64_t num_kv_heads = k.size(1);
  const int64_t head_dim = k.size(2);
  const int64_t block_size = key_cache.size(2);
  const int64_t row_bytes = head_dim * static_cast<int64_t>(k.element_size());
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  auto* kc = static_cast<char*>(key_cache.data_ptr());
  auto* vc = static_cast<char*>(value_cache.data_ptr());
  const auto* ks = static_cast<const char*>(k.const_data_ptr());
  const auto* vs = static_cast<const char*>(v.const_data_ptr());

  // Rows are small (head_dim elements): a grain of 64 keeps short decode
  // appends on the calling thread.
  at::parallel_for(0, num_tokens * num_kv_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t token = i / num_kv_heads;
      const int64_t head = i % num_kv_heads;
      const int64_t slot = slots[token];
      if (slot < 0) continue;  // padding token
      const int64_t block = slot / block_size;
      const int64_t dst =
          ((block * num_kv_heads + head) * block_size + slot % block_size) * row_bytes;
      std::memcpy(kc + dst, ks + i * row_bytes, static_cast<size_t>(row_bytes));
      std::memcpy(vc + dst, vs + i * row_bytes, static_cast<size_t>(row_bytes));
    }
  });
}

}  // namespace snapserve::kernels::cpu
