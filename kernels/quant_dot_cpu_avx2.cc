// AVX2 integer dot product of kernels/quant_dot.h: one weight block unpacked
// to 32 int8 lanes, then per activation row one maddubs (u8 x s8 -> pairs) and
// one madd (pairs -> the 8 int32 lane sums of elements 4l..4l+3), widened and
// accumulated exactly as the portable path does (multiply, then add; this file
// is compiled with -ffp-contract=off and its target has no "fma"). Up to four
// activation rows share each unpacked block.
#include "kernels/quant_dot.h"
#include "kernels/quant_dot_cpu_block.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#include "kernels/simd_sums.h"

namespace snapserve::kernels::cpu {

namespace {

// F16C: the block scales are halves (every AVX2 path of cpu_isa.h has it).
#define SNAPSERVE_AVX2_INT __attribute__((target("avx2,f16c")))

constexpr int64_t kRowsPerGroup = 4;

// 0xFF in byte j where bit j of `bits` is set.
SNAPSERVE_AVX2_INT inline __m256i bit_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
}

// The 32 nibbles of a legacy 4-bit block in element order (low nibbles are
// elements 0..15, high nibbles 16..31).
SNAPSERVE_AVX2_INT inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}

struct Unpacked {
  __m256i v;  // int8 values (signed types) or uint8 (Q4_1/Q5_1)
  float d, m;
};

SNAPSERVE_AVX2_INT inline float half_f16c(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);  // exact, the same value as dot_half_at
}

template <QuantType kType>
SNAPSERVE_AVX2_INT inline Unpacked unpack_as(const uint8_t* b) {
  Unpacked u;
  u.d = half_f16c(b);
  u.m = 0.0f;
  if constexpr (kType == QuantType::kQ8_0) {
    u.v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  } else if constexpr (kType == QuantType::kQ4_0) {
    u.v = _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
  } else if constexpr (kType == QuantType::kQ4_1) {
    u.m = half_f16c(b + 2);
    u.v = nibbles(b + 4);
  } else if constexpr (kType == QuantType::kQ5_0) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
    u.v = _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth), _mm256_set1_epi8(16));
  } else {  // kQ5_1
    uint32_t qh;
    u.m = half_f16c(b + 2);
    std::memcpy(&qh, b + 4, 4);
    const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
    u.v = _mm256_or_si256(nibbles(b + 8), fifth);
  }
  return u;
}

SNAPSERVE_AVX2_INT inline Unpacked unpack(QuantType type, const uint8_t* b) {
  switch (type) {
    case QuantType::kQ8_0:
      return unpack_as<QuantType::kQ8_0>(b);
    case QuantType::kQ4_0:
      return unpack_as<QuantType::kQ4_0>(b);
    case QuantType::kQ4_1:
      return unpack_as<QuantType::kQ4_1>(b);
    case QuantType::kQ5_0:
      return unpack_as<QuantType::kQ5_0>(b);
    default:
      return unpack_as<QuantType::kQ5_1>(b);
  }
}

// Weight rows [r_begin, r_end) against activation rows [i0, i0 + rows).
template <bool kSigned>
SNAPSERVE_AVX2_INT void rows_group(const QuantMatrix& w, const QuantizedRows& xq, int64_t r,
                                   int64_t i0, int64_t rows, float* out, int64_t n_total) {
  const int64_t blocks = xq.blocks;
  const int64_t bytes = quant_format(w.type).block_bytes;
  const uint8_t* wrow = w.row(r);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kRowsPerGroup];
  float offset[kRowsPerGroup];
  for (int64_t i = 0; i < rows; ++i) {
    acc[i] = _mm256_setzero_ps();
    offset[i] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const Unpacked u = unpack(w.type, wrow + b * bytes);
    const __m256i abs_w = kSigned ? _mm256_sign_epi8(u.v, u.v) : u.v;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t xb = (i0 + i) * blocks + b;
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + xb * 32));
      if constexpr (kSigned) xv = _mm256_sign_epi8(xv, u.v);
      const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, xv), ones);
      const __m256 scale = _mm256_set1_ps(u.d * xq.d[xb]);
      acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sums)));
      if constexpr (!kSigned) offset[i] = offset[i] + u.m * xq.s[xb];
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    out[(i0 + i) * n_total + r] = simd::lane_sum_avx2(acc[i]) + offset[i];
  }
}

// The hot path: four weight rows of one type against one or two activation
// rows, the type and the shapes template arguments so that the block
// unpacking has no branch and the accumulators stay in registers. Every
// output gets the same operations in the same order as rows_group (and the
// portable path): only which outputs share a loop differs.
constexpr int kQuad = 4;

template <QuantType kType, bool kPair>
SNAPSERVE_AVX2_INT void quad_rows(const QuantMatrix& w, const QuantizedRows& xq, int64_t r0,
                                  int64_t i0, float* out, int64_t n_total) {
  constexpr bool kSigned =
      kType == QuantType::kQ8_0 || kType == QuantType::kQ4_0 || kType == QuantType::kQ5_0;
  const int64_t blocks = xq.blocks;
  const int64_t bytes = quant_format(kType).block_bytes;
  const uint8_t* wrow[kQuad];
  for (int r = 0; r < kQuad; ++r) wrow[r] = w.row(r0 + r);
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* xa = xq.q.data() + i0 * blocks * 32;
  const int8_t* xb = kPair ? xa + blocks * 32 : xa;
  const float* da = xq.d.data() + i0 * blocks;
  const float* db = kPair ? da + blocks : da;
  const float* sa = xq.s.data() + i0 * blocks;
  const float* sb = kPair ? sa + blocks : sa;
  __m256 acc_a[kQuad], acc_b[kQuad];
  float off_a[kQuad], off_b[kQuad];
#pragma GCC unroll 4
  for (int r = 0; r < kQuad; ++r) {
    acc_a[r] = acc_b[r] = _mm256_setzero_ps();
    off_a[r] = off_b[r] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i xva = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa + b * 32));
    const __m256i xvb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + b * 32));
#pragma GCC unroll 4
    for (int r = 0; r < kQuad; ++r) {
      const Unpacked u = unpack_as<kType>(wrow[r] + b * bytes);
      const __m256i abs_w = kSigned ? _mm256_sign_epi8(u.v, u.v) : u.v;
      const __m256i sa_i = kSigned ? _mm256_sign_epi8(xva, u.v) : xva;
      const __m256i sums_a = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, sa_i), ones);
      acc_a[r] = _mm256_add_ps(
          acc_a[r], _mm256_mul_ps(_mm256_set1_ps(u.d * da[b]), _mm256_cvtepi32_ps(sums_a)));
      if constexpr (!kSigned) off_a[r] = off_a[r] + u.m * sa[b];
      if constexpr (kPair) {
        const __m256i sb_i = kSigned ? _mm256_sign_epi8(xvb, u.v) : xvb;
        const __m256i sums_b = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, sb_i), ones);
        acc_b[r] = _mm256_add_ps(
            acc_b[r], _mm256_mul_ps(_mm256_set1_ps(u.d * db[b]), _mm256_cvtepi32_ps(sums_b)));
        if constexpr (!kSigned) off_b[r] = off_b[r] + u.m * sb[b];
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kQuad; ++r) {
    out[i0 * n_total + r0 + r] = simd::lane_sum_avx2(acc_a[r]) + off_a[r];
    if constexpr (kPair)
      out[(i0 + 1) * n_total + r0 + r] = simd::lane_sum_avx2(acc_b[r]) + off_b[r];
  }
}

template <QuantType kType>
SNAPSERVE_AVX2_INT void quads(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin,
                              int64_t r_end, float* out, int64_t n_total) {
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kQuad) {
    for (int64_t i0 = 0; i0 < xq.m; i0 += 2) {
      if (i0 + 1 < xq.m) {
        quad_rows<kType, true>(w, xq, r0, i0, out, n_total);
      } else {
        quad_rows<kType, false>(w, xq, r0, i0, out, n_total);
      }
    }
  }
}

// Rows [r_begin, r_end) whose count is a multiple of kQuad; false for a type
// without a quad kernel.
bool run_quads(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin, int64_t r_end,
               float* out, int64_t n_total) {
  switch (w.type) {
    case QuantType::kQ8_0:
      quads<QuantType::kQ8_0>(w, xq, r_begin, r_end, out, n_total);
      return true;
    case QuantType::kQ4_0:
      quads<QuantType::kQ4_0>(w, xq, r_begin, r_end, out, n_total);
      return true;
    case QuantType::kQ4_1:
      quads<QuantType::kQ4_1>(w, xq, r_begin, r_end, out, n_total);
      return true;
    case QuantType::kQ5_0:
      quads<QuantType::kQ5_0>(w, xq, r_begin, r_end, out, n_total);
      return true;
    case QuantType::kQ5_1:
      quads<QuantType::kQ5_1>(w, xq, r_begin, r_end, out, n_total);
      return true;
    default:
      return false;
  }
}

}  // namespace

bool int8_dot_avx2(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin, int64_t r_end,
                   float* out, int64_t n_total) {
  const bool is_signed =
      w.type == QuantType::kQ8_0 || w.type == QuantType::kQ4_0 || w.type == QuantType::kQ5_0;
  // Small batches (a decode step of one or two sequences): whole quads of
  // weight rows through the unrolled kernel; the rest as before.
  if (xq.m <= 2) {
    const int64_t quad_end = r_begin + (r_end - r_begin) / kQuad * kQuad;
    if (quad_end > r_begin && run_quads(w, xq, r_begin, quad_end, out, n_total)) r_begin = quad_end;
  }
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t i0 = 0; i0 < xq.m; i0 += kRowsPerGroup) {
      const int64_t rows = std::min(kRowsPerGroup, xq.m - i0);
      if (is_signed) {
        rows_group<true>(w, xq, r, i0, rows, out, n_total);
      } else {
        rows_group<false>(w, xq, r, i0, rows, out, n_total);
      }
    }
  }
  return true;
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool int8_dot_avx2(const QuantMatrix&, const QuantizedRows&, int64_t, int64_t, float*, int64_t) {
  return false;
}
}  // namespace snapserve::kernels::cpu

#endif
