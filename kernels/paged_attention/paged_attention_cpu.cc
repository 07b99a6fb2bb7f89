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

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_dynamic.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/thread_scratch.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/paged_attention/paged_attention_cpu_block.h"

namespace snapserve::kernels::cpu {

namespace {

// Widens `count` cache elements (bfloat16 or float16) to float, for the
// portable block step. The SIMD steps widen as they load instead.
template <typename T>
void widen_portable(const T* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
}

// An int8 cache's values (kernels/kv_append/kv_append.h): float(q) times the scale of
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

// One implementation per process (see kernels/cpu/cpu_isa.h): the AVX-512 group
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

// Keys per work item. A (sequence, KV head) lane's context is cut into spans
// of whole blocks, about kSpanKeys keys each; a thread folds one span from
// the empty softmax state, and the spans' states are then merged in order.
// Why: a batch-1 step has as many lanes as the model has KV heads (SmolLM2:
// 3), which two threads split 2 : 1, and one thread waited for the other
// every layer (a third of the attention's time). Spans even that out. Their
// ends sit at fixed positions of the sequence, so a sequence's output does
// not depend on the batch around it or on the thread count, and a context
// of one span gives the bits of a single fold (the merge scales by
// exp(0) = 1); docs/kv-cache-and-scheduling.md, "Decode attention on CPU".
constexpr int64_t kSpanKeys = 256;

// The spans of a context of `blocks` blocks, at least one (an empty
// context's span folds nothing and yields zeros).
int64_t spans_of(int64_t blocks, int64_t span_blocks) {
  return std::max<int64_t>(1, (blocks + span_blocks - 1) / span_blocks);
}

// One span's online-softmax state, as HeadGroup holds it: acc [group,
// head_dim], then max and sum [group] each, in one scratch row.
int64_t span_state_floats(int64_t group, int64_t head_dim) { return group * (head_dim + 2); }

// Thread scratch slots (kernels/cpu/thread_scratch.h): the calling thread's span
// states, and each thread's working rows, alive at once on the caller.
constexpr int kSpanStatesSlot = 0;
constexpr int kSpanRowsSlot = 1;

// Writes the lane's output from its spans' states: out = sum_p acc_p e^(m_p
// - M) / sum_p sum_p e^(m_p - M), M the largest max, spans in order.
template <typename Q>
void merge_spans(const float* states, int64_t spans, int64_t group, int64_t head_dim, Q* out) {
  const int64_t stride = span_state_floats(group, head_dim);
  std::vector<float> acc(head_dim);
  for (int64_t h = 0; h < group; ++h) {
    const auto max_of = [&](int64_t p) { return states[p * stride + group * head_dim + h]; };
    const auto sum_of = [&](int64_t p) {
      return states[p * stride + group * head_dim + group + h];
    };
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < spans; ++p) top = std::max(top, max_of(p));
    float sum = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t p = 0; p < spans; ++p) {
      // An empty span (max -inf) adds nothing; exp(-inf) would be 0 anyway
      // except when every span is empty (-inf - -inf).
      if (max_of(p) == -std::numeric_limits<float>::infinity()) continue;
      const float f = std::exp(max_of(p) - top);
      const float* a = states + p * stride + h * head_dim;
      for (int64_t j = 0; j < head_dim; ++j) acc[j] += a[j] * f;
      sum += sum_of(p) * f;
    }
    // An empty context (padding row) yields zeros rather than 0/0.
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t j = 0; j < head_dim; ++j) out[h * head_dim + j] = static_cast<Q>(acc[j] * inv);
  }
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

  // Work items: every lane's spans, lane by lane; first_item[lane] is the
  // lane's first.
  const int64_t lanes = batch * num_kv_heads;
  const int64_t span_blocks = std::max<int64_t>(1, kSpanKeys / block_size);
  // The spans' bookkeeping and states in the calling thread's scratch, and
  // each thread's working rows in its own (kernels/cpu/thread_scratch.h): a
  // batch-1 step calls this 30 times, and its heap allocations and frees
  // ran on the leading thread while the others waited.
  const int64_t state_floats = span_state_floats(group, head_dim);
  int64_t items = 0;
  for (int64_t lane = 0; lane < lanes; ++lane) {
    items += spans_of((lens[lane / num_kv_heads] + block_size - 1) / block_size, span_blocks);
  }
  const int64_t index_bytes = ((lanes + 1) * int64_t{sizeof(int64_t)} + 63) / 64 * 64;
  const ThreadScratch bookkeeping(kSpanStatesSlot,
                                  index_bytes + items * state_floats * int64_t{sizeof(float)});
  auto* first_item = reinterpret_cast<int64_t*>(bookkeeping.get());
  auto* states = reinterpret_cast<float*>(bookkeeping.get() + index_bytes);
  first_item[0] = 0;
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const int64_t blocks = (lens[lane / num_kv_heads] + block_size - 1) / block_size;
    first_item[lane + 1] = first_item[lane] + spans_of(blocks, span_blocks);
  }

  const int64_t row_floats = widen ? block_size * head_dim : 0;
  const int64_t score_floats = score_scratch(block_size, group);
  parallel_shares(items, 1, [&](int64_t begin, int64_t end) {
    // This thread's rows, reused across the spans it takes: the scaled
    // query heads, the scores and (a 16-bit or int8 cache read portably)
    // the widened K and V rows. Each starts on a cache line.
    const auto lines = [](int64_t floats) { return (floats + 15) / 16 * 16; };
    const ThreadScratch rows(
        kSpanRowsSlot, (lines(group * head_dim) + lines(score_floats) + 2 * lines(row_floats)) *
                           int64_t{sizeof(float)});
    float* const qf = reinterpret_cast<float*>(rows.get());
    float* const scores = qf + lines(group * head_dim);
    float* const kbuf = scores + lines(score_floats);
    float* const vbuf = kbuf + lines(row_floats);

    for (int64_t item = begin; item < end; ++item) {
      const int64_t lane =
          std::upper_bound(first_item, first_item + lanes + 1, item) - first_item - 1;
      const int64_t b = lane / num_kv_heads;
      const int64_t g = lane % num_kv_heads;
      const int64_t ctx = lens[b];
      const Q* qb = q_ptr + (b * num_heads + g * group) * head_dim;
      for (int64_t i = 0; i < group * head_dim; ++i) qf[i] = static_cast<float>(qb[i]) * scale;
      float* state = states + item * state_floats;
      float* acc = state;
      float* run_max = state + group * head_dim;
      float* run_sum = run_max + group;
      std::fill(acc, acc + group * head_dim, 0.f);
      std::fill(run_max, run_max + group, -std::numeric_limits<float>::infinity());
      std::fill(run_sum, run_sum + group, 0.f);
      const HeadGroup hg{qf, acc, run_max, run_sum, group, head_dim};

      const int64_t num_blocks = (ctx + block_size - 1) / block_size;
      const int64_t first_blk = (item - first_item[lane]) * span_blocks;
      const int64_t last_blk = std::min(num_blocks, first_blk + span_blocks);
      for (int64_t blk = first_blk; blk < last_blk; ++blk) {
        const int64_t phys = tables[b * max_blocks + blk];
        const int64_t n = std::min(block_size, ctx - blk * block_size);
        const int64_t offset = (phys * num_kv_heads + g) * block_size * head_dim;
        // The next block's rows, for the SIMD steps to prefetch (past the
        // span's end too: this thread usually takes the next span).
        const T* next_k = nullptr;
        const T* next_v = nullptr;
        if (blk + 1 < num_blocks) {
          const int64_t ahead = (int64_t{tables[b * max_blocks + blk + 1]} * num_kv_heads + g) *
                                block_size * head_dim;
          next_k = k_ptr + ahead;
          next_v = v_ptr + ahead;
        }
        if constexpr (kIsFloat) {
          fold(hg, k_ptr + offset, v_ptr + offset, n, scores, next_k, next_v);
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
            fold_group_int8_avx512(hg, k_ptr + offset, ks, v_ptr + offset, vs, n, scores, next_k,
                                   next_v);
          } else {
            widen_int8(k_ptr + offset, ks, n * head_dim, kbuf);
            widen_int8(v_ptr + offset, vs, n * head_dim, vbuf);
            fold(hg, kbuf, vbuf, n, scores, nullptr, nullptr);
          }
        } else if (!widen) {
          auto bits = [](const T* p) { return reinterpret_cast<const uint16_t*>(p); };
          fold16(hg, bits(k_ptr + offset), bits(v_ptr + offset), n, scores, bits(next_k),
                 bits(next_v));
        } else {
          widen_portable<T>(k_ptr + offset, n * head_dim, kbuf);
          widen_portable<T>(v_ptr + offset, n * head_dim, vbuf);
          fold(hg, kbuf, vbuf, n, scores, nullptr, nullptr);
        }
      }
    }
  });

  // Lanes are independent and small (group x head_dim outputs each): the
  // threads split them only at batch sizes where it pays.
  parallel_for(0, lanes, 16, [&](int64_t begin, int64_t end) {
    for (int64_t lane = begin; lane < end; ++lane) {
      const int64_t b = lane / num_kv_heads, g = lane % num_kv_heads;
      merge_spans(states + first_item[lane] * state_floats, first_item[lane + 1] - first_item[lane],
                  group, head_dim, out_ptr + (b * num_heads + g * group) * head_dim);
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
