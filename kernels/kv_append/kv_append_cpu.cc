// CPU KV append: each (token, KV head) row is one contiguous head_dim copy
// (or conversion, for float32 rows into a 16-bit cache).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_team.h"
#include "kernels/kv_append/kv_append.h"

namespace snapserve::kernels::cpu {

namespace {

// Where row (token, head) of a [T, G, d] input starts: rows have their d
// values contiguous, tokens and heads any strides (e.g. a prompt's k, a view
// of its fused qkv product: no copy first).
struct RowStrides {
  explicit RowStrides(const at::Tensor& t) : token(t.stride(0)), head(t.stride(1)) {}
  int64_t at(int64_t t, int64_t h) const { return t * token + h * head; }
  int64_t token, head;
};

// Row i of src as the cache's element type T (float32 rounded by T's
// constructor, as Tensor::to rounds), or copied when src is already T.
template <typename T, typename S>
void copy_row(const S* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, S>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = T(src[j]);
  }
}

template <typename T, typename S>
void append_rows(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& slot_mapping) {
  const int64_t num_tokens = k.size(0);
  const int64_t num_kv_heads = k.size(1);
  const int64_t head_dim = k.size(2);
  const int64_t block_size = key_cache.size(2);
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  auto* kc = static_cast<T*>(key_cache.data_ptr());
  auto* vc = static_cast<T*>(value_cache.data_ptr());
  const auto* ks = static_cast<const S*>(k.const_data_ptr());
  const auto* vs = static_cast<const S*>(v.const_data_ptr());
  const RowStrides kr(k), vr(v);

  // Rows are small (head_dim elements): a grain of 64 keeps short decode
  // appends on the calling thread.
  parallel_for(0, num_tokens * num_kv_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t token = i / num_kv_heads;
      const int64_t head = i % num_kv_heads;
      const int64_t slot = slots[token];
      if (slot < 0) continue;  // padding token
      const int64_t block = slot / block_size;
      const int64_t dst =
          ((block * num_kv_heads + head) * block_size + slot % block_size) * head_dim;
      copy_row(ks + kr.at(token, head), kc + dst, head_dim);
      copy_row(vs + vr.at(token, head), vc + dst, head_dim);
    }
  });
}

}  // namespace

void quantize_kv_row(const float* x, int64_t d, int8_t* q, float* scales) {
  for (int64_t g = 0; g < d / kKvInt8Group; ++g) {
    const float* xg = x + g * kKvInt8Group;
    float amax = 0.0f;
    for (int64_t j = 0; j < kKvInt8Group; ++j) amax = std::max(amax, std::fabs(xg[j]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t j = 0; j < kKvInt8Group; ++j) {
      const float r = std::nearbyint(xg[j] * inv);
      q[g * kKvInt8Group + j] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
    scales[g] = scale;
  }
}

void kv_append_int8(at::Tensor& key_cache, at::Tensor& key_scales, at::Tensor& value_cache,
                    at::Tensor& value_scales, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& slot_mapping) {
  const int64_t num_tokens = k.size(0);
  const int64_t num_kv_heads = k.size(1);
  const int64_t head_dim = k.size(2);
  const int64_t groups = head_dim / kKvInt8Group;
  const int64_t block_size = key_cache.size(2);
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  int8_t* kc = key_cache.data_ptr<int8_t>();
  int8_t* vc = value_cache.data_ptr<int8_t>();
  float* ks = key_scales.data_ptr<float>();
  float* vs = value_scales.data_ptr<float>();
  const float* kin = k.const_data_ptr<float>();
  const float* vin = v.const_data_ptr<float>();
  const RowStrides kr(k), vr(v);
  const bool simd = cpu_isa() >= CpuIsa::kAvx512;
  auto quantize = [&](const float* x, int8_t* q, float* s) {
    if (!simd || !quantize_kv_row_avx512(x, head_dim, q, s)) quantize_kv_row(x, head_dim, q, s);
  };
  parallel_for(0, num_tokens * num_kv_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t token = i / num_kv_heads, head = i % num_kv_heads;
      const int64_t slot = slots[token];
      if (slot < 0) continue;  // padding token
      const int64_t row =
          ((slot / block_size) * num_kv_heads + head) * block_size + slot % block_size;
      quantize(kin + kr.at(token, head), kc + row * head_dim, ks + row * groups);
      quantize(vin + vr.at(token, head), vc + row * head_dim, vs + row * groups);
    }
  });
}

void kv_append(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
               const at::Tensor& v, const at::Tensor& slot_mapping) {
  if (k.scalar_type() == at::kFloat && key_cache.scalar_type() == at::kBFloat16) {
    return append_rows<c10::BFloat16, float>(key_cache, value_cache, k, v, slot_mapping);
  }
  if (k.scalar_type() == at::kFloat && key_cache.scalar_type() == at::kHalf) {
    return append_rows<c10::Half, float>(key_cache, value_cache, k, v, slot_mapping);
  }
  // Same dtype (float32, bfloat16 or float16: checks.h): rows copied as bits.
  if (key_cache.element_size() == 2) {
    return append_rows<uint16_t, uint16_t>(key_cache, value_cache, k, v, slot_mapping);
  }
  append_rows<uint32_t, uint32_t>(key_cache, value_cache, k, v, slot_mapping);
}

}  // namespace snapserve::kernels::cpu
