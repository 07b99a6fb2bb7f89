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

#define SNAPSERVE_AVX2_INT __attribute__((target("avx2")))

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

SNAPSERVE_AVX2_INT inline Unpacked unpack(QuantType type, const uint8_t* b) {
  Unpacked u;
  u.d = dot_half_at(b);
  u.m = 0.0f;
  switch (type) {
    case QuantType::kQ8_0:
      u.v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      break;
    case QuantType::kQ4_0:
      u.v = _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
      break;
    case QuantType::kQ4_1:
      u.m = dot_half_at(b + 2);
      u.v = nibbles(b + 4);
      break;
    case QuantType::kQ5_0: {
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
      u.v = _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth), _mm256_set1_epi8(16));
      break;
    }
    default: {  // kQ5_1
      uint32_t qh;
      u.m = dot_half_at(b + 2);
      std::memcpy(&qh, b + 4, 4);
      const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
      u.v = _mm256_or_si256(nibbles(b + 8), fifth);
      break;
    }
  }
  return u;
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

}  // namespace

bool int8_dot_avx2(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin, int64_t r_end,
                   float* out, int64_t n_total) {
  const bool is_signed =
      w.type == QuantType::kQ8_0 || w.type == QuantType::kQ4_0 || w.type == QuantType::kQ5_0;
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
