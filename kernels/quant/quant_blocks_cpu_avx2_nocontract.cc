// AVX2 decoders of the GGUF block formats (quant_blocks.h): the layouts
// documented in quant_blocks_nocontract.cc, 8 elements per step. Integers are unpacked in
// 32-bit lanes, converted exactly to float32, then scaled with the same
// multiply and add/subtract as the portable decoders. The target has no "fma"
// and this file is compiled with -ffp-contract=off (kernels/CMakeLists.txt),
// so d * q + m stays two roundings, as in gguf-py: every path gives the same
// bits. Types not written here (Q2_K, Q3_K) return false and use the portable
// decoder.
#include <c10/util/Half.h>

#include <cstring>

#include "kernels/cpu/x86/isa_target.h"
#include "kernels/quant/quant_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace snapserve::kernels::cpu {

namespace {

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

enum class Offset { kNone, kAdd, kSub };

// dst[0..8) = s * q (+ or - m), q as 8 int32 lanes.
template <Offset kOffset>
SNAPSERVE_TARGET_AVX2 inline void emit(float* dst, __m256i q, __m256 s, __m256 m) {
  __m256 v = _mm256_mul_ps(s, _mm256_cvtepi32_ps(q));
  if constexpr (kOffset == Offset::kAdd) v = _mm256_add_ps(v, m);
  if constexpr (kOffset == Offset::kSub) v = _mm256_sub_ps(v, m);
  _mm256_storeu_ps(dst, v);
}

// 8 bytes at p as unsigned 32-bit lanes.
SNAPSERVE_TARGET_AVX2 inline __m256i bytes8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// (v >> shift) & mask per lane.
SNAPSERVE_TARGET_AVX2 inline __m256i bits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(mask));
}

// Legacy 32-element blocks: nibble j (low of byte j, or high of byte j - 16)
// plus, for the 5-bit types, bit j of qh as the fifth bit; minus `bias`.
template <Offset kOffset, bool kFifthBit>
SNAPSERVE_TARGET_AVX2 void legacy_block(const uint8_t* qs, uint32_t qh, int bias, float d, float m,
                                        float* y) {
  const __m256 s = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
  const __m256i b = _mm256_set1_epi32(bias);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int g = 0; g < 4; ++g) {  // elements 8g .. 8g + 7
    const __m256i raw = bytes8(qs + 8 * (g % 2));
    __m256i q = bits(raw, 4 * (g / 2), 0x0F);
    if constexpr (kFifthBit) {
      const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * g));
      const __m256i hi =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qh), idx), _mm256_set1_epi32(1));
      q = _mm256_or_si256(q, _mm256_slli_epi32(hi, 4));
    }
    emit<kOffset>(y + 8 * g, _mm256_sub_epi32(q, b), s, mv);
  }
}

uint32_t high_bits(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian, as x86 is
  return v;
}

SNAPSERVE_TARGET_AVX2 void q8_0(const uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(half_at(b));
  for (int g = 0; g < 4; ++g) {
    const __m256i q =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * g)));
    // q * d: the same product as d * q.
    _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
  }
}

void k_scale_min(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 0x3F;
    *min = s[j + 4] & 0x3F;
  } else {
    *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *min = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

template <bool kFifthBit>
SNAPSERVE_TARGET_AVX2 void q45_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (kFifthBit ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    k_scale_min(b + 4, j, &sc, &mn);
    const __m256 s = _mm256_set1_ps(d * static_cast<float>(sc));
    const __m256 m = _mm256_set1_ps(dmin * static_cast<float>(mn));
    const uint8_t* q = qs + 32 * (j / 2);
    for (int g = 0; g < 4; ++g) {
      __m256i v = bits(bytes8(q + 8 * g), 4 * (j % 2), 0x0F);
      if constexpr (kFifthBit) {
        v = _mm256_or_si256(v, _mm256_slli_epi32(bits(bytes8(qh + 8 * g), j, 1), 4));
      }
      emit<Offset::kSub>(y + 32 * j + 8 * g, v, s, m);
    }
  }
}

SNAPSERVE_TARGET_AVX2 void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  const __m256i bias = _mm256_set1_epi32(32), zero = _mm256_setzero_si256();
  for (int e = 0; e < 256; e += 8) {
    const int h = e / 128, r = e % 128;
    const __m256i lo = bits(bytes8(ql + 64 * h + r % 64), 4 * (r / 64), 0x0F);
    const __m256i hi = bits(bytes8(qh + 32 * h + r % 32), 2 * (r / 32), 0x03);
    const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), bias);
    emit<Offset::kNone>(y + e, q, _mm256_set1_ps(d * static_cast<float>(sc[e / 16])),
                        _mm256_castsi256_ps(zero));
  }
}

}  // namespace

bool dequantize_row_avx2(QuantType type, const uint8_t* src, int64_t blocks, float* dst) {
  const QuantFormat& f = quant_format(type);
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * f.block_bytes;
    float* y = dst + i * f.block_elements;
    switch (type) {
      case QuantType::kQ4_0:
        legacy_block<Offset::kNone, false>(b + 2, 0, 8, half_at(b), 0.0f, y);
        break;
      case QuantType::kQ4_1:
        legacy_block<Offset::kAdd, false>(b + 4, 0, 0, half_at(b), half_at(b + 2), y);
        break;
      case QuantType::kQ5_0:
        legacy_block<Offset::kNone, true>(b + 6, high_bits(b + 2), 16, half_at(b), 0.0f, y);
        break;
      case QuantType::kQ5_1:
        legacy_block<Offset::kAdd, true>(b + 8, high_bits(b + 4), 0, half_at(b), half_at(b + 2), y);
        break;
      case QuantType::kQ8_0:
        q8_0(b, y);
        break;
      case QuantType::kQ4_K:
        q45_k<false>(b, y);
        break;
      case QuantType::kQ5_K:
        q45_k<true>(b, y);
        break;
      case QuantType::kQ6_K:
        q6_k(b, y);
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
bool dequantize_row_avx2(QuantType, const uint8_t*, int64_t, float*) { return false; }
}  // namespace snapserve::kernels::cpu

#endif
