// Internal to kernels/paged_attention_cpu*.cc: the per-block step of the CPU
// paged decode attention, one implementation per instruction set.
#pragma once

#include <cstdint>

namespace snapserve::kernels::cpu {

// The online-softmax state of the `group` query heads that share one KV head
// of one sequence: each head's scaled query, running max, running sum and
// unnormalized output accumulator. All float32, head h at h * head_dim.
struct HeadGroup {
  const float* q;  // [group, head_dim], already multiplied by the scale
  float* acc;      // [group, head_dim]
  float* run_max;  // [group], -inf before the first block
  float* run_sum;  // [group]
  int64_t group, head_dim;
};

// Folds one block of n (1 .. block_size) cache entries, rows k[t], v[t] of
// head_dim floats, into every head of the group. `scores`: scratch for
// score_scratch(n) floats. next_k / next_v: the next block's K and V rows
// (block_size of them) for the SIMD path to prefetch, or nullptr.
using FoldBlockFn = void (*)(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                             float* scores, const float* next_k, const float* next_v);

inline int64_t score_scratch(int64_t block_size) { return (block_size + 7) / 8 * 8; }

void fold_block_portable(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                         float* scores, const float* next_k, const float* next_v);

// AVX2 + FMA; head_dim must be a multiple of 8. Only when cpu_isa() is not
// kPortable.
void fold_block_avx2(const HeadGroup& hg, const float* k, const float* v, int64_t n, float* scores,
                     const float* next_k, const float* next_v);

// dst[i] = float(src[i]) for i < n, for a bfloat16 or float16 cache (both
// widen exactly). The AVX2 ones need cpu_isa() above kPortable (F16C for
// float16). `next`: the next block's entries (n of them), prefetched into L2
// in step with the widening, or nullptr: a 16-bit block is read here, so
// this is where its cache misses would wait (SpreadPrefetch, prefetch.h).
using WidenFn = void (*)(const uint16_t* src, int64_t n, float* dst, const uint16_t* next);
void widen_bfloat16_avx2(const uint16_t* src, int64_t n, float* dst, const uint16_t* next);
void widen_float16_avx2(const uint16_t* src, int64_t n, float* dst, const uint16_t* next);

}  // namespace snapserve::kernels::cpu
