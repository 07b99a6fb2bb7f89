// CPU paged decode attention. Work is split over (sequence, KV head) pairs so
// that the H/G query heads sharing a KV head reuse each K/V row they load
// (GQA). Each block of block_size entries is scored at once, then folded into
// a running (max, sum, accumulator) triple: online softmax, so memory stays
// O(block_size) per head whatever the context length.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/exp_avx2.h"
#include "kernels/paged_attention.h"

namespace snapserve::kernels::cpu {

namespace {

// Widens `count` elements to float. For float32 inputs callers skip the copy.
template <typename T>
void to_float(const T* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
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

#if defined(__x86_64__)
// AVX2 + FMA versions of the three inner loops (used when cpu_isa() allows).
#define SNAPSERVE_AVX2 __attribute__((target("avx2,fma")))

SNAPSERVE_AVX2 float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

SNAPSERVE_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;  // two chains hide the FMA latency
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

SNAPSERVE_AVX2 void axpy_avx2(float alpha, const float* __restrict x, float* __restrict y,
                              int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

SNAPSERVE_AVX2 float exp_and_sum_avx2(float* s, int64_t n, float max) {
  const __m256 vm = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = simd::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
    _mm256_storeu_ps(s + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  return hsum(vsum) + exp_and_sum(s + t, n - t, max);
}
#endif

// The inner loops of one (sequence, KV head) pair, portable or AVX2.
struct InnerLoops {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float, const float* __restrict, float* __restrict, int64_t);
  float (*exp_and_sum)(float*, int64_t, float);
};

InnerLoops inner_loops() {
#if defined(__x86_64__)
  if (cpu_isa() != CpuIsa::kPortable) return {dot_avx2, axpy_avx2, exp_and_sum_avx2};
#endif
  return {dot, axpy, exp_and_sum};
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
  const InnerLoops loops = inner_loops();

  at::parallel_for(0, batch * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    // Per-thread scratch, reused across the (sequence, head) pairs it handles.
    std::vector<float> qf(group * head_dim), acc(group * head_dim);
    std::vector<float> scores(group * block_size), run_max(group), run_sum(group);
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
          to_float(k_ptr + offset, n * head_dim, kbuf.data());
          to_float(v_ptr + offset, n * head_dim, vbuf.data());
          kb = kbuf.data();
          vb = vbuf.data();
        }

        for (int64_t h = 0; h < group; ++h) {
          float* s = scores.data() + h * block_size;
          float block_max = -std::numeric_limits<float>::infinity();
          for (int64_t t = 0; t < n; ++t) {
            s[t] = loops.dot(qf.data() + h * head_dim, kb + t * head_dim, head_dim);
            block_max = std::max(block_max, s[t]);
          }
          const float new_max = std::max(run_max[h], block_max);
          // exp(-inf) = 0 clears the empty state on the first block.
          const float rescale = std::exp(run_max[h] - new_max);
          float* a = acc.data() + h * head_dim;
          if (rescale != 1.f) {
            for (int64_t j = 0; j < head_dim; ++j) a[j] *= rescale;
          }
          run_sum[h] = run_sum[h] * rescale + loops.exp_and_sum(s, n, new_max);
          run_max[h] = new_max;
          for (int64_t t = 0; t < n; ++t) loops.axpy(s[t], vb + t * head_dim, a, head_dim);
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
                            const at::Tensor& context_lens, double scale, at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, key_cache.scalar_type(), "paged_decode_attention_cpu", [&] {
        if (q.scalar_type() == key_cache.scalar_type()) {
          run<scalar_t, scalar_t>(q, key_cache, value_cache, block_tables, context_lens,
                                  static_cast<float>(scale), out);
        } else {
          run<scalar_t, float>(q, key_cache, value_cache, block_tables, context_lens,
                               static_cast<float>(scale), out);
        }
      });
}

}  // namespace snapserve::kernels::cpu
