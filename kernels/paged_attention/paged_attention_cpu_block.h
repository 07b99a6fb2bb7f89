// Internal to kernels/paged_attention/paged_attention_cpu*.cc: the per-block step of the CPU
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
// score_scratch(block_size, group) floats. next_k / next_v: the next block's K and V rows
// (block_size of them) for the SIMD path to prefetch, or nullptr.
using FoldBlockFn = void (*)(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                             float* scores, const float* next_k, const float* next_v);

// Scores of one head for a block of n entries (rounded up for the SIMD
// steps' whole vectors), and the scratch a step needs: one such row per head
// of the group (the AVX-512 step scores every head first; the others reuse
// the first row).
inline int64_t score_stride(int64_t n) { return (n + 7) / 8 * 8; }
inline int64_t score_scratch(int64_t block_size, int64_t group) {
  return group * score_stride(block_size);
}

void fold_block_portable(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                         float* scores, const float* next_k, const float* next_v);

// AVX2 + FMA; head_dim must be a multiple of 8. Only when cpu_isa() is not
// kPortable.
void fold_block_avx2(const HeadGroup& hg, const float* k, const float* v, int64_t n, float* scores,
                     const float* next_k, const float* next_v);

// The same step over a 16-bit cache's rows (bfloat16 or float16 bits),
// widened to float32 as they are loaded (exactly: the same bits as folding
// the widened rows with fold_block_avx2). AVX2 level (F16C included).
using FoldBlock16Fn = void (*)(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                               float* scores, const uint16_t* next_k, const uint16_t* next_v);
void fold_block_bfloat16_avx2(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                              float* scores, const uint16_t* next_k, const uint16_t* next_v);
void fold_block_float16_avx2(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                             float* scores, const uint16_t* next_k, const uint16_t* next_v);

// AVX-512F steps that fold the whole group per row load
// (paged_attention_cpu_avx512.cc), float32 and 16-bit caches; only where
// has_group_fold_avx512(group, head_dim) and cpu_isa() >= kAvx512.
bool has_group_fold_avx512(int64_t group, int64_t head_dim);
void fold_group_avx512(const HeadGroup& hg, const float* k, const float* v, int64_t n,
                       float* scores, const float* next_k, const float* next_v);
void fold_group_bfloat16_avx512(const HeadGroup& hg, const uint16_t* k, const uint16_t* v,
                                int64_t n, float* scores, const uint16_t* next_k,
                                const uint16_t* next_v);
void fold_group_float16_avx512(const HeadGroup& hg, const uint16_t* k, const uint16_t* v, int64_t n,
                               float* scores, const uint16_t* next_k, const uint16_t* next_v);
// An int8 cache's block (kernels/kv_append/kv_append.h): k_scales / v_scales hold the
// block's group scales, one per 16 values from k / v. The same bits as
// fold_group_avx512 on the widened rows.
void fold_group_int8_avx512(const HeadGroup& hg, const int8_t* k, const float* k_scales,
                            const int8_t* v, const float* v_scales, int64_t n, float* scores,
                            const int8_t* next_k, const int8_t* next_v);

}  // namespace snapserve::kernels::cpu
