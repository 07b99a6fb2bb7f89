// CPU paged decode attention. Work is split over (sequence, KV head) pairs so
// that the H/G query heads sharing a KV head reuse each K/V row they load
// (GQA). Each block of block_size entries is scored at once, then folded into
// a running (max, sum, accumulator) triple: online softmax, so memory stays
// O(block_size) per head whatever the context length. The per-block step is
// in paged_attention_cpu_block.h: portable here (16-bit rows widened into a
// buffer first), AVX2 in _avx2.cc and the AVX-512 group step in _avx512.cc
// (both read a 16-bit cache in place); docs/kv-cache-and-scheduling.md,
// "Decode attention on CPU".
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/paged_attention.h"
#include "kernels/paged_attention_cpu_block.h"
#include "kernels/prefetch.h"

namespace snapserve::kernels::cpu {

namespace {

// Widens `count` cache elements (bfloat16 or float16) to float, for the
// portable block step. The SIMD steps widen as they load instead.
template <typename T>
void widen_portable(const T* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
}

// An int8 cache's values (kernels/kv_append.h): float(q) times the scale of
// its group of 16, the values Int8Rows (paged_attention_cpu_rows.h) loads.
void widen_int8(const int8_t* src, const float* scales, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]) * scales[i / 16];
}

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: the compiler may not reorder a single
  // float sum into SIMD lanes (no -ffast-math), but it does vectorize
  // independent lanes written out like this.
  constexpr int64_t kLanes = 8;
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) part[j] += a[i + j] * b[i + j];
  }
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int64_t j = 0; j < kLanes; ++j) s += part[j];
  return s;
}

void axpy(float alpha, const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// s[t] = exp(s[t] - max) for t < n; returns their sum in order.
float exp_and_sum(float* s, int64_t n, float max) {
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - max);
    sum += s[t];
  }
  return sum;
}

}  // namespace

// The loops above, per block (the reference order the SIMD path restructures).
void fold_block_portable(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                         float* scores, const float*, const float*) {
  const int64_t D = hg.head_dim;
  for (int64_t h = 0; h < hg.group; ++h) {
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) {
      scores[t] = dot(hg.q + h * D, k + t * D, D);
      block_max = std::max(block_max, scores[t]);
    }
    const float new_max = std::max(hg.run_max[h], block_max);
    // exp(-inf) = 0 clears the empty state on the first block.
    const float rescale = std::exp(hg.run_max[h] - new_max);
    float* a = hg.acc + h * D;
    if (rescale != 1.f) {
      for (int64_t j = 0; j < D; ++j) a[j] *= rescale;
    }
    hg.run_sum[h] = hg.run_sum[h] * rescale + exp_and_sum(scores, n, new_max);
    hg.run_max[h] = new_max;
    for (int64_t t = 0; t < n; ++t) axpy(scores[t], v + t * D, a, D);
  }
}

namespace {

// One implementation per process (see kernels/cpu_isa.h): the AVX-512 group
// step where the shape suits it, else the AVX2 one (head_dim a multiple of
// its 8 lanes), else the portable one.
bool group_fold(int64_t group, int64_t head_dim) {
  return cpu_isa() >= CpuIsa::kAvx512 && has_group_fold_avx512(group, head_dim);
}

FoldBlockFn fold_block_for(int64_t group, int64_t head_dim) {
  if (group_fold(group, head_dim)) return fold_group_avx512;
  if (cpu_isa() != CpuIsa::kPortable && head_dim % 8 == 0) return fold_block_avx2;
  return fold_block_portable;
}

// A 16-bit cache's SIMD block step, which reads its rows in place; nullptr
// where the portable step runs (on rows widened into a scratch buffer first).
template <typename T>
FoldBlock16Fn fold_block16_for(int64_t group, int64_t head_dim) {
  if (cpu_isa() == CpuIsa::kPortable || head_dim % 8 != 0) return nullptr;
  const bool wide = group_fold(group, head_dim);
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return wide ? fold_group_bfloat16_avx512 : fold_block_bfloat16_avx2;
  }
  if constexpr (std::is_same_v<T, c10::Half>) {
    return wide ? fold_group_float16_avx512 : fold_block_float16_avx2;
  }
  return nullptr;
}

// T: the cache's element type; Q: the query's and output's (T or float).
// k_scales / v_scales: an int8 cache's (T = int8_t), else null.
template <typename T, typename Q>
void run(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
         const at::Tensor& block_tables, const at::Tensor& context_lens, float scale,
         at::Tensor& out, const float* k_scales = nullptr, const float* v_scales = nullptr) {
  const int64_t batch = q.size(0);
  const int64_t num_heads = q.size(1);
  const int64_t head_dim = q.size(2);
  const int64_t num_kv_heads = key_cache.size(1);
  const int64_t block_size = key_cache.size(2);
  const int64_t max_blocks = block_tables.size(1);
  const int64_t group = num_heads / num_kv_heads;

  const Q* q_ptr = q.data_ptr<Q>();
  const T* k_ptr = key_cache.data_ptr<T>();
  const T* v_ptr = value_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  Q* out_ptr = out.data_ptr<Q>();
  constexpr bool kIsFloat = std::is_same_v<T, float>;
  constexpr bool kIsInt8 = std::is_same_v<T, int8_t>;
  const FoldBlockFn fold = fold_block_for(group, head_dim);
  const FoldBlock16Fn fold16 = kIsInt8 ? nullptr : fold_block16_for<T>(group, head_dim);
  // An int8 cache is read in place by the AVX-512 group step, else widened.
  const bool int8_in_place = kIsInt8 && group_fold(group, head_dim);
  // Rows widened for the portable step of a 16-bit cache.
  const bool widen = !kIsFloat && fold16 == nullptr && !int8_in_place;

  at::parallel_for(0, batch * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    // Per-thread scratch, reused across the (sequence, head) pairs it handles.
    std::vector<float> qf(group * head_dim), acc(group * head_dim);
    std::vector<float> scores(score_scratch(block_size, group)), run_max(group), run_sum(group);
    std::vector<float> kbuf(widen ? block_size * head_dim : 0);
    std::vector<float> vbuf(widen ? block_size * head_dim : 0);

    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / num_kv_heads;
      const int64_t g = pair % num_kv_heads;
      const int64_t ctx = lens[b];
      const Q* qb = q_ptr + (b * num_heads + g * group) * head_dim;
      for (int64_t i = 0; i < group * head_dim; ++i) qf[i] = static_cast<float>(qb[i]) * scale;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<float>::infinity());
      std::fill(run_sum.begin(), run_sum.end(), 0.f);
      const HeadGroup hg{qf.data(), acc.data(), run_max.data(), run_sum.data(), group, head_dim};

      const int64_t num_blocks = (ctx + block_size - 1) / block_size;
      for (int64_t blk = 0; blk < num_blocks; ++blk) {
        const int64_t phys = tables[b * max_blocks + blk];
        const int64_t n = std::min(block_size, ctx - blk * block_size);
        const int64_t offset = (phys * num_kv_heads + g) * block_size * head_dim;
        // The next block's rows, for the SIMD steps to prefetch.
        const T* next_k = nullptr;
        const T* next_v = nullptr;
        if (blk + 1 < num_blocks) {
          const int64_t ahead = (int64_t{tables[b * max_blocks + blk + 1]} * num_kv_heads + g) *
                                block_size * head_dim;
          next_k = k_ptr + ahead;
          next_v = v_ptr + ahead;
        }
        if constexpr (kIsFloat) {
          fold(hg, k_ptr + offset, v_ptr + offset, n, scores.data(), next_k, next_v);
        } else if constexpr (kIsInt8) {
          const float* ks = k_scales + offset / 16;
          const float* vs = v_scales + offset / 16;
          if (int8_in_place && next_k != nullptr) {
            // The next block's scales: the rows' prefetch does not bring
            // them, and each K row's first load waited on its scale's miss
            // (a fifth of the int8 scores' samples in W3).
            const int64_t next = next_k - k_ptr, bytes = block_size * head_dim / 16 * 4;
            prefetch_lines(k_scales + next / 16, bytes);
            prefetch_lines(v_scales + next / 16, bytes);
          }
          if (int8_in_place) {
            fold_group_int8_avx512(hg, k_ptr + offset, ks, v_ptr + offset, vs, n, scores.data(),
                                   next_k, next_v);
          } else {
            widen_int8(k_ptr + offset, ks, n * head_dim, kbuf.data());
            widen_int8(v_ptr + offset, vs, n * head_dim, vbuf.data());
            fold(hg, kbuf.data(), vbuf.data(), n, scores.data(), nullptr, nullptr);
          }
        } else if (!widen) {
          auto bits = [](const T* p) { return reinterpret_cast<const uint16_t*>(p); };
          fold16(hg, bits(k_ptr + offset), bits(v_ptr + offset), n, scores.data(), bits(next_k),
                 bits(next_v));
        } else {
          widen_portable<T>(k_ptr + offset, n * head_dim, kbuf.data());
          widen_portable<T>(v_ptr + offset, n * head_dim, vbuf.data());
          fold(hg, kbuf.data(), vbuf.data(), n, scores.data(), nullptr, nullptr);
        }
      }

      Q* ob = out_ptr + (b * num_heads + g * group) * head_dim;
      for (int64_t h = 0; h < group; ++h) {
        // An empty context (padding row) yields zeros rather than 0/0.
        const float inv = run_sum[h] > 0.f ? 1.f / run_sum[h] : 0.f;
        for (int64_t j = 0; j < head_dim; ++j) {
          ob[h * head_dim + j] = static_cast<Q>(acc[h * head_dim + j] * inv);
        }
      }
    }
  });
}

}  // namespace

void paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale, at::Tensor& out,
                            const at::Tensor& key_scales, const at::Tensor& value_scales) {
  // The cache dtypes the dispatcher admits (kernels/checks.h, and int8).
  auto run_for = [&]<typename T>() {
    if (q.scalar_type() == key_cache.scalar_type()) {
      run<T, T>(q, key_cache, value_cache, block_tables, context_lens, static_cast<float>(scale),
                out);
    } else {
      run<T, float>(q, key_cache, value_cache, block_tables, context_lens,
                    static_cast<float>(scale), out);
    }
  };
  switch (key_cache.scalar_type()) {
    case at::kChar:  // q is float32 (the dispatcher checks)
      return run<int8_t, float>(q, key_cache, value_cache, block_tables, context_lens,
                                static_cast<float>(scale), out, key_scales.const_data_ptr<float>(),
                                value_scales.const_data_ptr<float>());
    case at::kFloat:
      return run_for.operator()<float>();
    case at::kBFloat16:
      return run_for.operator()<c10::BFloat16>();
    case at::kHalf:
      return run_for.operator()<c10::Half>();
    default:
      TORCH_CHECK(false, "paged_decode_attention_cpu: unsupported cache dtype ",
                  key_cache.scalar_type());
  }
}

}  // namespace snapserve::kernels::cpu
