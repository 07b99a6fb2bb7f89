// Activation quantization and the portable integer dot product of
// kernels/quant_dot/quant_dot.h. Compiled with -ffp-contract=off (kernels/CMakeLists.txt):
// the AVX2 path must reproduce these float operations exactly.
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/quant_dot/quant_dot.h"
#include "kernels/quant_dot/quant_dot_cpu_block.h"

namespace snapserve::kernels {

bool has_int8_dot(QuantType type) {
  switch (type) {
    case QuantType::kQ4_0:
    case QuantType::kQ4_1:
    case QuantType::kQ5_0:
    case QuantType::kQ5_1:
    case QuantType::kQ8_0:
      return true;
    default:
      return false;
  }
}

namespace cpu {

void quantize_blocks_portable(const float* x, int64_t blocks, int8_t* q, float* d, float* s) {
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xb = x + i * kDotBlock;
    float amax = 0.0f;
    for (int j = 0; j < kDotBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    int sum = 0;
    for (int j = 0; j < kDotBlock; ++j) {
      // Round half to even, as _mm256_round_ps does on the AVX2 path's
      // callers' inputs; |x * inv| <= 127 up to one rounding, clamped.
      const float v = std::clamp(std::nearbyint(xb[j] * inv), -127.0f, 127.0f);
      q[i * kDotBlock + j] = static_cast<int8_t>(v);
      sum += static_cast<int>(v);
    }
    d[i] = scale;
    s[i] = scale * static_cast<float>(sum);
  }
}

QuantizedRows quantize_rows(const float* x, int64_t m, int64_t k) {
  TORCH_CHECK(k % kDotBlock == 0, "int8 dot: K = ", k, " is not a multiple of ", kDotBlock);
  QuantizedRows r;
  r.m = m;
  r.k = k;
  r.blocks = k / kDotBlock;
  r.q.resize(static_cast<size_t>(m * k));
  r.d.resize(static_cast<size_t>(m * r.blocks));
  r.s.resize(static_cast<size_t>(m * r.blocks));
  quantize_blocks_portable(x, m * r.blocks, r.q.data(), r.d.data(), r.s.data());
  return r;
}

void arrange_for_vnni(QuantizedRows& xq) {
  constexpr int64_t kGroup = 8, kHalf = kDotBlock / 2;
  xq.vnni_groups = (xq.blocks + kGroup - 1) / kGroup;
  xq.vnni_q.assign(static_cast<size_t>(xq.m * xq.vnni_groups * kGroup * kDotBlock), 0);
  xq.vnni_sums.assign(static_cast<size_t>(xq.m * xq.vnni_groups * kGroup), 0);
  for (int64_t i = 0; i < xq.m; ++i) {
    for (int64_t b = 0; b < xq.blocks; ++b) {
      const int8_t* src = xq.q.data() + (i * xq.blocks + b) * kDotBlock;
      const int64_t g = b / kGroup, within = b % kGroup, pair = within % 4;
      // Block `within` < 4 is the pair's first block, else its second.
      int8_t* dst = xq.vnni_q.data() + ((i * xq.vnni_groups + g) * 4 + pair) * 2 * kDotBlock +
                    (within < 4 ? 0 : kHalf);
      std::memcpy(dst, src, kHalf);
      std::memcpy(dst + kDotBlock, src + kHalf, kHalf);
      int sum = 0;
      for (int64_t j = 0; j < kDotBlock; ++j) sum += src[j];
      xq.vnni_sums[static_cast<size_t>((i * xq.vnni_groups + g) * kGroup + within)] = sum;
    }
  }
}

void int8_dot_portable(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin,
                       int64_t r_end, float* out, int64_t n_total) {
  const int64_t blocks = xq.blocks;
  const int64_t bytes = quant_format(w.type).block_bytes;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const uint8_t* wrow = w.row(r);
    for (int64_t i = 0; i < xq.m; ++i) {
      float lanes[8] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t xb = i * blocks + b;
        lanes[b % 8] =
            add_block_term(read_block(w.type, wrow + b * bytes), xq.q.data() + xb * kDotBlock,
                           xq.d[xb], xq.s[xb], lanes[b % 8]);
      }
      out[i * n_total + r] = simd::lane_sum_portable(lanes);
    }
  }
}

}  // namespace cpu
}  // namespace snapserve::kernels
