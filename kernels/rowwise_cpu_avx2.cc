// AVX2 SwiGLU gate (rowwise.h): silu(g) * u = g / (1 + exp(-g)) * u, eight
// lanes at a time; the tail falls back to libm like the portable loop.
#include "kernels/rowwise.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/exp_avx2.h"
#endif

namespace snapserve::kernels::cpu {

#if defined(__x86_64__)
__attribute__((target("avx2"))) bool silu_mul_row_avx2(const float* gate, const float* up,
                                                       int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = simd::exp_avx2(_mm256_xor_ps(g, sign));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  return true;
}
#else  // not x86-64: cpu_isa() is always kPortable, this is never called
bool silu_mul_row_avx2(const float*, const float*, int64_t, float*) { return false; }
#endif

}  // namespace snapserve::kernels::cpu
