// The AMX tile instructions our kernels use (x86-64 only), written out as
// inline asm: GCC 12's intrinsics tell the compiler neither that a tile load
// reads memory nor that ldtilecfg reads all 64 bytes, so stores just before
// them could be moved past them. Callers check has_amx_bf16()
// (kernels/cpu/cpu_isa.h): it also asks Linux for the tile state.
#pragma once

#if defined(__x86_64__)
#include <cstdint>

namespace snapserve::kernels::cpu::amx {

// The tile configuration ldtilecfg reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

inline constexpr int kTileRows = 16, kTileBytes = 64;

// Every one of the eight registers 16 rows of 64 bytes.
inline TileConfig all_tiles_full() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.bytes_per_row[t] = kTileBytes;
    c.rows[t] = kTileRows;
  }
  return c;
}

// The configuration is per thread: load it in each pool thread's share of
// the work, and release the tiles at its end.
inline void load_config(const TileConfig& c) { asm volatile("ldtilecfg %0" ::"m"(c)); }
inline void release_tiles() { asm volatile("tilerelease" ::: "memory"); }
template <int kTile>
inline void tile_zero() {
  asm volatile("tilezero %%tmm%c0" ::"i"(kTile));
}
template <int kTile>
inline void tile_load(const void* base, int64_t stride_bytes) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride_bytes), "i"(kTile)
               : "memory");
}
// tile_load with the non-temporal hint (tileloaddt1): the lines come to the
// core without taking L1's most-recently-used places, so operands that are
// read once per pass leave the reused ones in L1.
template <int kTile>
inline void tile_load_once(const void* base, int64_t stride_bytes) {
  asm volatile("tileloaddt1 (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride_bytes), "i"(kTile)
               : "memory");
}
template <int kTile>
inline void tile_store(void* base, int64_t stride_bytes) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride_bytes), "i"(kTile)
               : "memory");
}
// c += a · b: a's rows are bf16 pairs along the summed dimension, b's rows
// are pairs of that dimension by 16 columns; float32 sums.
template <int kC, int kA, int kB>
inline void tile_dot_bf16() {
  asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(kC), "i"(kA), "i"(kB));
}

}  // namespace snapserve::kernels::cpu::amx

#endif
