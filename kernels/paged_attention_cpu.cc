// CPU paged decode attention. Work is split over (sequence, KV head) pairs so
// that the H/G query heads sharing a KV head reuse each K/V row they load
// (GQA). Each block of block_size entries is scored at once, then folded into
// a running (max, sum, accumulator) triple: online softmax, so memory stays
// O(block_size) per head whatever the context length. The per-block step is
// in paged_attention_cpu_block.h (portable here, AVX2 in _avx2.cc).
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

namespace snapserve::kernels::cpu {

namespace {

// Widens `count` cache elements (bfloat16 or float16, as 16-bit words) to
// float. For float32 caches callers skip the copy.
template <typename T>
void widen_portable(const uint16_t* src, int64_t count, float* dst, const uint16_t*) {
  const T* s = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
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

// One implementation per process (see kernels/cpu_isa.h); the SIMD one needs
// head_dim a multiple of its 8 lanes.
FoldBlockFn fold_block_for(int64_t head_dim) {
  if (cpu_isa() != CpuIsa::kPortable && head_dim % 8 == 0) return fold_block_avx2;
  return fold_block_portable;
}

// A 16-bit cache's widening step; nullptr for float32 caches (read in place).
template <typename T>
WidenFn widen_for() {
  const bool simd = cpu_isa() != CpuIsa::kPortable;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return simd ? widen_bfloat16_avx2 : widen_portable<T>;
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return simd ? widen_float16_avx2 : widen_portable<T>;
  } else {
    static_assert(std::is_same_v<T, float>);
    return nullptr;
  }
}

// T: the cache's element type; Q: the query's and output's (T or float).
template <typename T, typename Q>
void run(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
         const at::Tensor& block_tables, const at::Tensor& context_lens, float scale,
         at::Tensor& out) {
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
  const FoldBlockFn fold = fold_block_for(head_dim);
  const WidenFn widen = widen_for<T>();

  at::parallel_for(0, batch * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    // Per-thread scratch, reused across the (sequence, head) pairs it handles.
    std::vector<float> qf(group * head_dim), acc(group * head_dim);
    std::vector<float> scores(score_scratch(block_size)), run_max(group), run_sum(group);
    std::vector<float> kbuf(kIsFloat ? 0 : block_size * head_dim);
    std::vector<float> vbuf(kIsFloat ? 0 : block_size * head_dim);

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
        const float* kb;
        const float* vb;
        if constexpr (kIsFloat) {
          kb = k_ptr + offset;
          vb = v_ptr + offset;
        } else {
          // The next block's entries are prefetched while this one widens.
          const uint16_t* next_k16 = nullptr;
          const uint16_t* next_v16 = nullptr;
          if (blk + 1 < num_blocks) {
            const int64_t ahead = (int64_t{tables[b * max_blocks + blk + 1]} * num_kv_heads + g) *
                                  block_size * head_dim;
            next_k16 = reinterpret_cast<const uint16_t*>(k_ptr + ahead);
            next_v16 = reinterpret_cast<const uint16_t*>(v_ptr + ahead);
          }
          widen(reinterpret_cast<const uint16_t*>(k_ptr + offset), n * head_dim, kbuf.data(),
                next_k16);
          widen(reinterpret_cast<const uint16_t*>(v_ptr + offset), n * head_dim, vbuf.data(),
                next_v16);
          kb = kbuf.data();
          vb = vbuf.data();
        }

        // The next block's rows, for the fold to prefetch. Only float32
        // caches: other dtypes are widened into kbuf / vbuf, read from L1.
        const float* next_k = nullptr;
        const float* next_v = nullptr;
        if constexpr (kIsFloat) {
          if (blk + 1 < num_blocks) {
            const int64_t ahead = (int64_t{tables[b * max_blocks + blk + 1]} * num_kv_heads + g) *
                                  block_size * head_dim;
            next_k = k_ptr + ahead;
            next_v = v_ptr + ahead;
          }
        }
        fold(hg, kb, vb, n, scores.data(), next_k, next_v);
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
                            const at::Tensor& context_lens, double scale, at::Tensor& out) {
  // The three cache dtypes the dispatcher admits (kernels/checks.h).
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
