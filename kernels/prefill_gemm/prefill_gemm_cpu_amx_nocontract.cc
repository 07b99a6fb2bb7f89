// The tile loop of kernels/prefill_gemm/prefill_gemm_amx.h.
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
// Each step loads four tiles, issues four tdpbf16ps, and runs a row or two
// of the previous block's epilogue on AVX-512 (gemm_block). A thread's blocks go
// row block by row block over a run of column blocks whose weight tiles fit
// in L2 (kWeightRunBytes): a row block's x tiles (32 x k bf16: 36 KiB at
// k = 576) stay in L1 across the run, and its outputs are written a row
// segment after another. The weight tiles load with the non-temporal hint
// (tile_load_once), so the 36 KiB of them each block streams past do not
// evict x's from the 48 KiB L1. The other order (column blocks outer, a run
// of row blocks inner) reloads x's tiles from L2 for every column block
// (docs/quantized-weights.md, "The prompt GEMM on AMX tiles").
#include "kernels/prefill_gemm/prefill_gemm_amx.h"

#if defined(__x86_64__)
#include "kernels/cpu/x86/avx512_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/x86/amx_tiles.h"
#include "kernels/cpu/x86/exp_avx512.h"
#include "kernels/cpu/x86/isa_target.h"

namespace snapserve::kernels::cpu {

namespace {

constexpr int64_t kBlock = kAmxGemmBlock, kHalf = 16, kStep = 32;
// A weight tile: 16 pairs x 16 columns x 2 bf16.
constexpr int64_t kWeightTile = int64_t{16} * 16 * 2;
// The weight tiles of one run of column blocks, in bytes (L2 is 2 MiB).
constexpr int64_t kWeightRunBytes = int64_t{1024} * 1024;
// 16 bf16 values widened to float32 exactly (the bits shifted up).
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// x's tiles (amx_packed_offset) are the weight's: 16 x 32 bf16.
static_assert(kWeightTile == 512 && kHalf == 16 && kStep == 32);

// Row `row` of the SwiGLU epilogue's output, the down product's x (k: the
// intermediate size, n / 2), at column `col` (a multiple of 16, so the 16
// values are contiguous).
uint16_t* packed_row(const AmxGemmArgs& a, int64_t row, int64_t col) {
  return static_cast<uint16_t*>(a.out) + amx_packed_offset(a.n / 2, row, col);
}

// A block's sums, stored from the tiles, waiting for their epilogue; row0
// -1: none.
struct PendingBlock {
  int64_t row0 = -1, cb = 0;
  alignas(64) float c[kBlock][kBlock];
};

// store_rows' float32 and plain bf16 outputs: rows [r0, r1) of b, real rows.
template <AmxEpilogue kEpilogue>
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C inline void store_float32_rows(const AmxGemmArgs& a,
                                                                            const PendingBlock& b,
                                                                            int64_t r0,
                                                                            int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const __m512 lo = _mm512_load_ps(b.c[r]), hi = _mm512_load_ps(b.c[r] + 16);
    const int64_t at = (b.row0 + r) * a.n + b.cb * kBlock;
    switch (kEpilogue) {
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
        break;  // store_rows' own loop
    }
  }
}

// Rows [r0, r1) of block b to a.out. Column block cb covers output columns
// cb * 32.. , or under kSwiGluPacked the gate's columns cb * 16.. (c's
// columns 0-15) and the up columns beside them (16-31).
// (A template on the epilogue, so that each tile loop inlines its own.)
template <AmxEpilogue kEpilogue>
[[gnu::always_inline]] SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C inline void store_rows(
    const AmxGemmArgs& a, const PendingBlock& b, int64_t r0, int64_t r1) {
  if (b.row0 < 0) return;
  if constexpr (kEpilogue == AmxEpilogue::kSwiGluPacked) {
    // Every row, the padding too (zero products, zero outputs): the down
    // product reads whole tiles. Gate and up are rounded to bf16 first, as
    // linear_amx's kBFloat16 output is; the gate is
    // simd::silu_mul_for_bf16_avx512, within a bf16 rounding of
    // silu_mul(linear_amx(x, gate_up, kBFloat16), kBFloat16), in fewer
    // instructions than silu_mul's exact operations and division, which on
    // AMX add to the tile products' time (docs/quantized-weights.md, "The
    // MLP in one pass").
    for (int64_t r = r0; r < r1; ++r) {
      const __m512i rounded = __builtin_bit_cast(
          __m512i, _mm512_cvtne2ps_pbh(_mm512_load_ps(b.c[r] + kHalf), _mm512_load_ps(b.c[r])));
      const __m512 gate = widen_bf16(_mm512_castsi512_si256(rounded));
      const __m512 up = widen_bf16(_mm512_extracti64x4_epi64(rounded, 1));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(packed_row(a, b.row0 + r, b.cb * kHalf)),
          __builtin_bit_cast(__m256i,
                             _mm512_cvtneps_pbh(simd::silu_mul_for_bf16_avx512(gate, up))));
    }
  } else {
    store_float32_rows<kEpilogue>(a, b, r0, std::min(r1, a.m - b.row0));
  }
}

// One 32 x 32 output block, rows row0.. of column block cb, into `mine`;
// the epilogue of the block before (`previous`) runs a few rows after each
// k step meanwhile. Out of order execution did not overlap a whole epilogue
// with the next block's tile loop, and an epilogue run between blocks left
// the tile unit idle: a third of the loop's time at the gate/up shape
// (docs/quantized-weights.md, "The MLP in one pass").
template <AmxEpilogue kEpilogue>
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void gemm_block(const AmxGemmArgs& a, int64_t row0,
                                                             int64_t cb,
                                                             const PendingBlock& previous,
                                                             PendingBlock& mine) {
  using namespace amx;  // NOLINT(google-build-using-namespace): the tile vocabulary
  const int64_t steps = a.k / kStep;
  // x's tiles, packed as the weight's are: 16 rows x 32 k values, 1 KiB each.
  const uint16_t* x0 = a.x + (row0 / kHalf) * steps * kWeightTile;
  const uint16_t* x1 = x0 + steps * kWeightTile;
  // The block's two column tiles, each steps tiles long: 2 cb and the next,
  // or under kSwiGluPacked gate tile cb and its up tile, n / 32 further.
  constexpr bool swiglu = kEpilogue == AmxEpilogue::kSwiGluPacked;
  const uint16_t* w0 = a.w + (swiglu ? cb : 2 * cb) * steps * kWeightTile;
  const uint16_t* w1 = w0 + (swiglu ? a.n / kBlock : 1) * steps * kWeightTile;
  // The previous epilogue's rows per step: all 32 within the loop.
  const int64_t rows_per_step = (kBlock + steps - 1) / steps;
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
    const int64_t r0 = s * rows_per_step;
    if (r0 < kBlock) store_rows<kEpilogue>(a, previous, r0, std::min(kBlock, r0 + rows_per_step));
  }
  constexpr int64_t kStride = kBlock * sizeof(float);
  tile_store<0>(&mine.c[0][0], kStride);
  tile_store<1>(&mine.c[0][kHalf], kStride);
  tile_store<2>(&mine.c[kHalf][0], kStride);
  tile_store<3>(&mine.c[kHalf][kHalf], kStride);
  mine.row0 = row0;
  mine.cb = cb;
}

// gemm_amx_blocks for one epilogue.
template <AmxEpilogue kEpilogue>
SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void run_blocks(const AmxGemmArgs& a,
                                                             int64_t row_block_begin,
                                                             int64_t row_block_end,
                                                             int64_t col_block_begin,
                                                             int64_t col_block_end) {
  const int64_t run = std::max<int64_t>(1, kWeightRunBytes / (kBlock * a.k * 2));
  PendingBlock blocks[2];  // the block being computed and the one before
  int next = 0;
  for (int64_t cb0 = col_block_begin; cb0 < col_block_end; cb0 += run) {
    const int64_t cb1 = std::min(col_block_end, cb0 + run);
    for (int64_t rb = row_block_begin; rb < row_block_end; ++rb) {
      for (int64_t cb = cb0; cb < cb1; ++cb) {
        gemm_block<kEpilogue>(a, rb * kBlock, cb, blocks[next ^ 1], blocks[next]);
        next ^= 1;
      }
    }
  }
  store_rows<kEpilogue>(a, blocks[next ^ 1], 0, kBlock);  // the last block's epilogue
}

}  // namespace

SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C void pack_amx_rows(const float* x,
                                                                const uint16_t* x_bf16, int64_t m,
                                                                int64_t k, int64_t row0,
                                                                int64_t row1, uint16_t* dst) {
  const int64_t steps = k / kStep;
  for (int64_t r = row0; r < row1; ++r) {
    uint16_t* tile_row = dst + amx_packed_offset(k, r, 0);
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

void pack_amx_row(const uint16_t* row_bf16, int64_t k, int64_t row, uint16_t* dst) {
  uint16_t* tile_row = dst + amx_packed_offset(k, row, 0);
  for (int64_t s = 0; s < k / kStep; ++s) {
    std::memcpy(tile_row + s * kWeightTile, row_bf16 + s * kStep, kStep * sizeof(uint16_t));
  }
}

void gemm_amx_blocks(const AmxGemmArgs& a, int64_t row_block_begin, int64_t row_block_end,
                     int64_t col_block_begin, int64_t col_block_end) {
  static const amx::TileConfig config = amx::all_tiles_full();
  amx::load_config(config);
  const auto run = [&]<AmxEpilogue kEpilogue>() {
    run_blocks<kEpilogue>(a, row_block_begin, row_block_end, col_block_begin, col_block_end);
  };
  switch (a.epilogue) {
    case AmxEpilogue::kStoreFloat32:
      run.template operator()<AmxEpilogue::kStoreFloat32>();
      break;
    case AmxEpilogue::kAddFloat32:
      run.template operator()<AmxEpilogue::kAddFloat32>();
      break;
    case AmxEpilogue::kStoreBFloat16:
      run.template operator()<AmxEpilogue::kStoreBFloat16>();
      break;
    case AmxEpilogue::kSwiGluPacked:
      run.template operator()<AmxEpilogue::kSwiGluPacked>();
      break;
  }
  amx::release_tiles();
}

}  // namespace snapserve::kernels::cpu

#else

namespace snapserve::kernels::cpu {
// Never called off x86-64: amx_gemm_fits is false there.
void pack_amx_rows(const float*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, uint16_t*) {}
void pack_amx_row(const uint16_t*, int64_t, int64_t, uint16_t*) {}
void gemm_amx_blocks(const AmxGemmArgs&, int64_t, int64_t, int64_t, int64_t) {}
}  // namespace snapserve::kernels::cpu

#endif
