#include "kernels/quant/random_blocks.h"

#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstring>

namespace snapserve::kernels {
namespace {

// Byte offsets of a block's float16 fields (the layouts in quant_blocks_nocontract.cc);
// returns how many (1 or 2).
int half_fields(QuantType type, int offsets[2]) {
  switch (type) {
    case QuantType::kQ4_0:
    case QuantType::kQ5_0:
    case QuantType::kQ8_0:
      offsets[0] = 0;
      return 1;
    case QuantType::kQ4_1:
    case QuantType::kQ5_1:
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
      offsets[0] = 0, offsets[1] = 2;
      return 2;
    case QuantType::kQ2_K:
      offsets[0] = 80, offsets[1] = 82;
      return 2;
    case QuantType::kQ3_K:
      offsets[0] = 108;
      return 1;
    case QuantType::kQ6_K:
      offsets[0] = 208;
      return 1;
  }
  TORCH_CHECK(false, "unknown quant type ", static_cast<uint32_t>(type));
}

}  // namespace

void random_blocks(QuantType type, uint64_t seed, float half_stddev, int64_t blocks, uint8_t* dst) {
  const QuantFormat& f = quant_format(type);
  int offsets[2];
  const int fields = half_fields(type, offsets);
  SplitMix64 rng(seed);
  const int64_t n = blocks * f.block_bytes;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.next();
    std::memcpy(dst + i, &r, 8);
  }
  if (i < n) {
    const uint64_t r = rng.next();
    std::memcpy(dst + i, &r, static_cast<size_t>(n - i));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    for (int k = 0; k < fields; ++k) {
      const uint16_t bits = c10::Half(half_stddev * rng.approx_normal()).x;
      std::memcpy(dst + b * f.block_bytes + offsets[k], &bits, 2);
    }
  }
}

}  // namespace snapserve::kernels
