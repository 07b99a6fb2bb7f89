// AVX-512 tile kernel of the fixed-order CPU linear (linear_cpu_tiles.h).
//
// A 4 × 4 register tile (16 accumulators, 4 weight and 4 x vectors: 24 of the
// 32 zmm registers) does 16 multiply-adds per 8 loads, against 8 per 6 for
// the AVX2 2 × 4 tile; at batch 16 the kernel is compute bound, so that ratio
// is what sets the decode step time.
//
// Per output element: 16 lanes, lane l accumulating x[j]·w[j] for j ≡ l
// (mod 16) in increasing j with FMA; then lanes l and l + 8 added, then the
// same tree as the AVX2 path over the remaining 8; then the K % 16 tail.
#include "kernels/linear/linear_cpu_tiles.h"

#if defined(__x86_64__)
#define SNAPSERVE_TILE_TARGET SNAPSERVE_TARGET_AVX512F_AVX2_FMA
#include "kernels/linear/linear_cpu_tile_avx512_driver.h"

namespace snapserve::kernels::cpu {

namespace {

// Sixteen float32 lanes per step, one FMA per x and weight vector; the
// K % 16 elements are added after the lane sum, in order.
struct Float32Step {
  using Elem = float;
  using Operand = __m512;
  static constexpr int64_t kStep = 16;
  [[gnu::always_inline]] SNAPSERVE_TILE_TARGET static __m512 load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  [[gnu::always_inline]] SNAPSERVE_TILE_TARGET static __m512 madd(__m512 acc, __m512 x, __m512 w) {
    return _mm512_fmadd_ps(x, w, acc);
  }
  template <int NW>
  static void add_short_step(__m512*, const float*, const float* const*, int64_t, int64_t) {}
  static float finish(float total, const float* x, const float* w, int64_t from, int64_t k) {
    return add_tail(total, x, w, from, k);
  }
};

}  // namespace

void tile_avx512(const Problem& p, const float* const* wr, int64_t rows, int64_t n0,
                 const float* const* next) {
  tile::run<Float32Step>(p, wr, rows, n0, next);
}

}  // namespace snapserve::kernels::cpu

#else  // not x86-64: cpu_isa() is never kAvx512, the tile is never called

namespace snapserve::kernels::cpu {
void tile_avx512(const Problem&, const float* const*, int64_t, int64_t, const float* const*) {}
}  // namespace snapserve::kernels::cpu

#endif
