// Block formats: table, dispatch, and the portable decoders (quant_blocks.h).
// Each decoder is written as gguf-py's dequantize_blocks computes it; the
// comments give the element -> bits mapping, which is the layout of
// llama.cpp's ggml-common.h block structs.
#include "kernels/quant/quant_blocks.h"

#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstring>

#include "kernels/cpu/cpu_isa.h"

namespace snapserve::kernels {

namespace {

constexpr int64_t kQK = 256;  // elements of a K-quant super-block

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Q4_0: d, 16 bytes of nibbles. Element j < 16 is the low nibble of byte j,
// element j + 16 its high nibble; value d * (nibble - 8).
void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1: d, m, nibbles as Q4_0; value d * nibble + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// The fifth bits of Q5_0/Q5_1: bit j of a little-endian uint32 is element j's.
uint32_t high_bits(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// Q5_0: d, 4 bytes of fifth bits, nibbles as Q4_0; value d * (q - 16).
void q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint32_t qh = high_bits(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | ((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1: d, m, fifth bits, nibbles; value d * q + m.
void q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = high_bits(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | ((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0: d, 32 int8; value q * d.
void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: 16 scale bytes (low nibble scale, high nibble min, per 16 elements),
// 64 bytes of 2-bit values, d, dmin. Element e: byte qs[32 * (e / 128) + e % 32],
// bits 2 * ((e % 128) / 32); value (d * scale) * q - (dmin * min).
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int e = 0; e < kQK; ++e) {
    const uint8_t sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0x0F);
    const float ml = dmin * static_cast<float>(sc >> 4);
    const int q = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit
// signed scales (one per 16 elements), d. Element e: low bits as Q2_K, high
// bit (hmask[e % 32] >> (e / 32)) & 1, q = low - 4 * (1 - high); scale i has
// its low nibble in byte i % 8 (shift 4 * (i / 8)) and its top two bits in
// byte 8 + i % 4 (shift 2 * (i / 4)), minus 32. Value (d * scale) * q.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = half_at(b + 108);
  for (int e = 0; e < kQK; ++e) {
    const int i = e / 16;
    const int lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
    const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
    const float dl = d * static_cast<float>(static_cast<int8_t>(lo | hi << 4) - 32);
    const int low = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const int high = (hmask[e % 32] >> (e / 32)) & 1;
    y[e] = dl * static_cast<float>(low - ((high ^ 1) << 2));
  }
}

// The 6-bit scale and min of sub-block j (32 elements) of Q4_K / Q5_K, from
// their 12 packed bytes.
void k_scale_min(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 0x3F;
    *min = s[j + 4] & 0x3F;
  } else {
    *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *min = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// Q4_K: d, dmin, 12 scale bytes, 128 bytes of nibbles. Sub-block j (32
// elements) reads bytes 32 * (j / 2) .. + 31, low nibbles for even j, high for
// odd; value (d * scale_j) * q - (dmin * min_j).
void q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    k_scale_min(b + 4, j, &sc, &mn);
    const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l)
      y[32 * j + l] = dj * static_cast<float>((q[l] >> shift) & 0x0F) - mj;
  }
}

// Q5_K: as Q4_K with 32 bytes of fifth bits before the nibbles: element l of
// sub-block j has bit (qh[l] >> j) & 1.
void q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    k_scale_min(b + 4, j, &sc, &mn);
    const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = dj * static_cast<float>(v) - mj;
    }
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one
// per 16 elements), d. Element e, half h = e / 128, r = e % 128: low nibble of
// ql[64 * h + r % 64] (shift 4 * (r / 64)), high bits of qh[32 * h + r % 32]
// (shift 2 * (r / 32)); value (d * scale) * (q - 32).
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128, r = e % 128;
    const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
    const float ds = d * static_cast<float>(sc[e / 16]);
    y[e] = ds * static_cast<float>((lo | hi << 4) - 32);
  }
}

using BlockDecoder = void (*)(const uint8_t*, float*);

BlockDecoder decoder(QuantType t) {
  switch (t) {
    case QuantType::kQ4_0:
      return q4_0;
    case QuantType::kQ4_1:
      return q4_1;
    case QuantType::kQ5_0:
      return q5_0;
    case QuantType::kQ5_1:
      return q5_1;
    case QuantType::kQ8_0:
      return q8_0;
    case QuantType::kQ2_K:
      return q2_k;
    case QuantType::kQ3_K:
      return q3_k;
    case QuantType::kQ4_K:
      return q4_k;
    case QuantType::kQ5_K:
      return q5_k;
    case QuantType::kQ6_K:
      return q6_k;
  }
  TORCH_CHECK(false, "unknown quant type ", static_cast<uint32_t>(t));
}

}  // namespace

std::optional<QuantType> quant_type_from_ggml(uint32_t ggml_type) {
  switch (ggml_type) {
    case 2:
    case 3:
    case 6:
    case 7:
    case 8:
    case 10:
    case 11:
    case 12:
    case 13:
    case 14:
      return static_cast<QuantType>(ggml_type);
    default:
      return std::nullopt;
  }
}

const QuantFormat& quant_format(QuantType t) {
  static const QuantFormat kQ4_0{32, 18, "Q4_0"}, kQ4_1{32, 20, "Q4_1"}, kQ5_0{32, 22, "Q5_0"},
      kQ5_1{32, 24, "Q5_1"}, kQ8_0{32, 34, "Q8_0"}, kQ2_K{kQK, 84, "Q2_K"}, kQ3_K{kQK, 110, "Q3_K"},
      kQ4_K{kQK, 144, "Q4_K"}, kQ5_K{kQK, 176, "Q5_K"}, kQ6_K{kQK, 210, "Q6_K"};
  switch (t) {
    case QuantType::kQ4_0:
      return kQ4_0;
    case QuantType::kQ4_1:
      return kQ4_1;
    case QuantType::kQ5_0:
      return kQ5_0;
    case QuantType::kQ5_1:
      return kQ5_1;
    case QuantType::kQ8_0:
      return kQ8_0;
    case QuantType::kQ2_K:
      return kQ2_K;
    case QuantType::kQ3_K:
      return kQ3_K;
    case QuantType::kQ4_K:
      return kQ4_K;
    case QuantType::kQ5_K:
      return kQ5_K;
    case QuantType::kQ6_K:
      return kQ6_K;
  }
  TORCH_CHECK(false, "unknown quant type ", static_cast<uint32_t>(t));
}

namespace cpu {
void dequantize_row_portable(QuantType type, const uint8_t* src, int64_t blocks, float* dst) {
  const QuantFormat& f = quant_format(type);
  const BlockDecoder decode = decoder(type);
  for (int64_t i = 0; i < blocks; ++i) decode(src + i * f.block_bytes, dst + i * f.block_elements);
}
}  // namespace cpu

void dequantize_row(QuantType type, const uint8_t* src, int64_t elements, float* dst) {
  const QuantFormat& f = quant_format(type);
  TORCH_CHECK(elements % f.block_elements == 0, f.name, ": ", elements,
              " elements are not a whole number of ", f.block_elements, "-element blocks");
  const int64_t blocks = elements / f.block_elements;
  if (cpu_isa() != CpuIsa::kPortable && cpu::dequantize_row_avx2(type, src, blocks, dst)) return;
  cpu::dequantize_row_portable(type, src, blocks, dst);
}

}  // namespace snapserve::kernels
