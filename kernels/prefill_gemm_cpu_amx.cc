// The tile loop of kernels/prefill_gemm_amx.h.
//
// One output block is 32 rows x 32 columns in four float32 tiles, summed
// over k in steps of 32:
//   tmm0-tmm3  the block's sums: rows 0-15 / 16-31 x columns 0-15 / 16-31;
//   tmm4-tmm5  x's rows 0-15 and 16-31, 32 k values (16 bf16 pairs) each,
//              packed by pack_amx_rows as 1 KiB tiles (row-major x's 16 rows
//              lie 2k bytes apart, which the loads and prefetchers took
//              worse);
//   tmm6-tmm7  the weight's 16 pairs along k x 16 columns, for columns 0-15
//              and 16-31: 1 KiB each, contiguous in the packed layout.
// Each step loads four tiles and issues four tdpbf16ps. A thread's blocks go
// row block by row block over a run of column blocks whose weight tiles fit
// in L2 (kWeightRunBytes): a row block's x tiles (32 x k bf16: 36 KiB at
// k = 576) stay in L1 across the run, and its outputs are written a row
// segment after another. The weight tiles load with the non-temporal hint
// (tile_load_once), so the 36 KiB of them each block streams past do not
// evict x's from the 48 KiB L1: 1.2-1.25x the loop's speed at k = 576, one
// thread (docs/quantized-weights.md, sixth session). The other order (column blocks outer, a run of
// row blocks inner) took 1.5x as long on the 2,048 x 3,072 x 576 gate/up product, one thread
// (docs/quantized-weights.md).
#include "kernels/prefill_gemm_amx.h"

#if defined(__x86_64__)
#include "kernels/avx512_intrinsics.h"

#include <algorithm>
#include <cstdint>

#include "kernels/amx_tiles.h"
#include "kernels/exp_avx512.h"

namespace snapserve::kernels::cpu {

namespace {

#define SNAPSERVE_AMX_GEMM \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

constexpr int64_t kBlock = kAmxGemmBlock, kHalf = 16, kStep = 32;
// A weight tile: 16 pairs x 16 columns x 2 bf16.
constexpr int64_t kWeightTile = int64_t{16} * 16 * 2;
// The weight tiles of one run of column blocks, in bytes (L2 is 2 MiB).
constexpr int64_t kWeightRunBytes = int64_t{1024} * 1024;
// 16 bf16 values widened to float32 exactly (the bits shifted up).
SNAPSERVE_AMX_GEMM inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Row `row` of the SwiGLU epilogue's output, the down product's x: packed
// as pack_amx_rows lays it out, at intermediate column `col` (a multiple of
// 16, so the 16 values are contiguous).
uint16_t* packed_row(const AmxGemmArgs& a, int64_t row, int64_t col) {
  const int64_t steps = a.n / 2 / kStep;  // the intermediate size / 32
  return static_cast<uint16_t*>(a.out) + (row / kHalf) * steps * kWeightTile +
         (col / kStep) * kWeightTile + (row % kHalf) * kStep + col % kStep;
}

// c's 32 rows to a.out. Column block cb covers output columns cb * 32.. ,
// or under kSwiGluPacked the gate's columns cb * 16.. (c's columns 0-15)
// and the up columns beside them (16-31).
SNAPSERVE_AMX_GEMM void store_block(const AmxGemmArgs& a, int64_t row0, int64_t cb,
                                    const float (&c)[kBlock][kBlock]) {
  if (a.epilogue == AmxEpilogue::kSwiGluPacked) {
    // Every row, the padding too (zero products, zero outputs): the down
    // product reads whole tiles. Gate and up are rounded to bf16 first, as
    // linear_amx's kBFloat16 output is, then take silu_mul's operations: the
    // bits of silu_mul(linear_amx(x, gate_up, kBFloat16), kBFloat16).
    for (int64_t r = 0; r < kBlock; ++r) {
      const __m512i rounded = __builtin_bit_cast(
          __m512i, _mm512_cvtne2ps_pbh(_mm512_load_ps(c[r] + kHalf), _mm512_load_ps(c[r])));
      const __m512 gate = widen_bf16(_mm512_castsi512_si256(rounded));
      const __m512 up = widen_bf16(_mm512_extracti64x4_epi64(rounded, 1));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(packed_row(a, row0 + r, cb * kHalf)),
          __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(simd::silu_mul_avx512(gate, up))));
    }
    return;
  }
  const int64_t rows = std::min(kBlock, a.m - row0), col0 = cb * kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 lo = _mm512_load_ps(c[r]), hi = _mm512_load_ps(c[r] + 16);
    const int64_t at = (row0 + r) * a.n + col0;
    switch (a.epilogue) {
      case AmxEpilogue::kStoreFloat32: {
        float* dst = static_cast<float*>(a.out) + at;
        _mm512_storeu_ps(dst, lo);
        _mm512_storeu_ps(dst + 16, hi);
        break;
      }
      case AmxEpilogue::kAddFloat32: {
        float* dst = static_cast<float*>(a.out) + at;
        _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), lo));
        _mm512_storeu_ps(dst + 16, _mm512_add_ps(_mm512_loadu_ps(dst + 16), hi));
        break;
      }
      case AmxEpilogue::kStoreBFloat16: {
        uint16_t* dst = static_cast<uint16_t*>(a.out) + at;
        _mm512_storeu_si512(dst, __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
        break;
      }
      case AmxEpilogue::kSwiGluPacked:
        break;  // above
    }
  }
}

// One 32 x 32 output block: rows row0.., column block cb.
SNAPSERVE_AMX_GEMM void gemm_block(const AmxGemmArgs& a, int64_t row0, int64_t cb) {
  using namespace amx;  // NOLINT(google-build-using-namespace): the tile vocabulary
  const int64_t steps = a.k / kStep;
  // x's tiles, packed as the weight's are: 16 rows x 32 k values, 1 KiB each.
  const uint16_t* x0 = a.x + (row0 / kHalf) * steps * kWeightTile;
  const uint16_t* x1 = x0 + steps * kWeightTile;
  // The block's two column tiles, each steps tiles long: 2 cb and the next,
  // or under kSwiGluPacked gate tile cb and its up tile, n / 32 further.
  const bool swiglu = a.epilogue == AmxEpilogue::kSwiGluPacked;
  const uint16_t* w0 = a.w + (swiglu ? cb : 2 * cb) * steps * kWeightTile;
  const uint16_t* w1 = w0 + (swiglu ? a.n / kBlock : 1) * steps * kWeightTile;
  tile_zero<0>();
  tile_zero<1>();
  tile_zero<2>();
  tile_zero<3>();
  for (int64_t s = 0; s < steps; ++s) {
    tile_load<4>(x0 + s * kWeightTile, kTileBytes);
    tile_load_once<6>(w0 + s * kWeightTile, kTileBytes);
    tile_dot_bf16<0, 4, 6>();
    tile_load_once<7>(w1 + s * kWeightTile, kTileBytes);
    tile_dot_bf16<1, 4, 7>();
    tile_load<5>(x1 + s * kWeightTile, kTileBytes);
    tile_dot_bf16<2, 5, 6>();
    tile_dot_bf16<3, 5, 7>();
  }
  alignas(64) float c[kBlock][kBlock];
  constexpr int64_t kStride = kBlock * sizeof(float);
  tile_store<0>(&c[0][0], kStride);
  tile_store<1>(&c[0][kHalf], kStride);
  tile_store<2>(&c[kHalf][0], kStride);
  tile_store<3>(&c[kHalf][kHalf], kStride);
  store_block(a, row0, cb, c);
}

}  // namespace

SNAPSERVE_AMX_GEMM void pack_amx_rows(const float* x, const uint16_t* x_bf16, int64_t m, int64_t k,
                                      int64_t row0, int64_t row1, uint16_t* dst) {
  const int64_t steps = k / kStep;
  for (int64_t r = row0; r < row1; ++r) {
    uint16_t* tile_row = dst + (r / kHalf) * steps * kWeightTile + (r % kHalf) * kStep;
    for (int64_t s = 0; s < steps; ++s) {
      __m512i v = _mm512_setzero_si512();
      if (r < m && x != nullptr) {
        const float* src = x + r * k + s * kStep;
        v = __builtin_bit_cast(
            __m512i, _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src)));
      } else if (r < m) {
        v = _mm512_loadu_si512(x_bf16 + r * k + s * kStep);
      }
      _mm512_store_si512(tile_row + s * kWeightTile, v);
    }
  }
}

void gemm_amx_blocks(const AmxGemmArgs& a, int64_t row_block_begin, int64_t row_block_end,
                     int64_t col_block_begin, int64_t col_block_end) {
  static const amx::TileConfig config = amx::all_tiles_full();
  amx::load_config(config);
  const int64_t run = std::max<int64_t>(1, kWeightRunBytes / (kBlock * a.k * 2));
  for (int64_t cb0 = col_block_begin; cb0 < col_block_end; cb0 += run) {
    const int64_t cb1 = std::min(col_block_end, cb0 + run);
    for (int64_t rb = row_block_begin; rb < row_block_end; ++rb) {
      for (int64_t cb = cb0; cb < cb1; ++cb) gemm_block(a, rb * kBlock, cb);
    }
  }
  amx::release_tiles();
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
// Never called off x86-64: amx_gemm_fits is false there.
void pack_amx_rows(const float*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, uint16_t*) {}
void gemm_amx_blocks(const AmxGemmArgs&, int64_t, int64_t, int64_t, int64_t) {}
}  // namespace snapserve::kernels::cpu

#endif
