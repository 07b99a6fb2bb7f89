// Fixed-order CPU kernel of the linear layer (linear.h) for decode-sized m.
//
// Work is split over tiles of kTile weight rows. bfloat16 rows are first
// widened to float32 into a small scratch buffer (bfloat16 is the top half of
// a float32: a 16-bit shift), GGUF-quantized rows decoded into it
// (quant_blocks.h); float32 rows are read in place. Each tile is
// then dotted with every row of x, a few x rows at a time, so each weight
// byte comes from memory once per call whatever m is.
//
// One instruction set serves the whole process: AVX-512 (linear_cpu_avx512.cc,
// 16 lanes), else AVX2 + FMA (here, 8 lanes), else portable C++ (8 lanes).
// Within it every output element is the same sequence of operations — the
// lanes accumulated over K in order, summed in a fixed tree, then the K tail —
// whichever tile shape or batch row it belongs to. That makes a row's result
// independent of the batch it is computed in.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_team.h"
#include "kernels/cpu/x86/isa_target.h"
#include "kernels/cpu/x86/simd_sums.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/linear_cpu_tiles.h"
#include "kernels/quant/quant_blocks.h"

namespace snapserve::kernels::cpu {

namespace {

// The AVX-512 kernel prefetches the float32 weight tile this many tiles ahead
// (into L2) while it computes: the hardware prefetcher alone left a batch-16
// decode step's linears waiting on DRAM. One step of the 135M model, weights
// not cached, batch 16: 42 ms without, 35 ms prefetching from the first
// x-row block only, 29 ms shared out over four blocks (linear_cpu_avx512.cc);
// 2, 4, 8 tiles ahead within noise of each other.
constexpr int64_t kPrefetchTiles = 4;
constexpr int64_t kLanes = 8;  // float32 partial sums per dot product (portable, AVX2)

float widen(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// ---- portable path (any CPU) -------------------------------------------
float lane_sum(const float* p) { return simd::lane_sum_portable(p); }

// Output columns n0 .. n0 + rows - 1 from float32 weight rows wr[0 .. rows).
void tile_portable(const Problem& p, const float* const* wr, int64_t rows, int64_t n0) {
  const int64_t k = p.k, k8 = k - k % kLanes;
  for (int64_t i = 0; i < p.m; ++i) {
    const float* xi = p.x + i * k;
    for (int64_t r = 0; r < rows; ++r) {
      float acc[kLanes] = {};
      for (int64_t j = 0; j < k8; j += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) acc[l] += xi[j + l] * wr[r][j + l];
      }
      p.out[i * p.n_total + n0 + r] = add_tail(lane_sum(acc), xi, wr[r], k8, k);
    }
  }
}

void widen_rows_portable(const uint16_t* src, int64_t count, float* dst) {
  for (int64_t j = 0; j < count; ++j) dst[j] = widen(src[j]);
}

// ---- AVX2 + FMA path -----------------------------------------------------
#if defined(__x86_64__)

// The portable lane_sum's tree, on a register.
SNAPSERVE_TARGET_AVX2_FMA inline float lane_sum(__m256 v) { return simd::lane_sum_avx2(v); }

SNAPSERVE_TARGET_AVX2_FMA void widen_rows_avx2(const uint16_t* src, int64_t count, float* dst) {
  int64_t j = 0;
  for (; j + kLanes <= count; j += kLanes) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j));
    _mm256_storeu_ps(dst + j, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; j < count; ++j) dst[j] = widen(src[j]);
}

SNAPSERVE_TARGET_AVX2_FMA void tile_avx2(const Problem& p, const float* const* wr, int64_t rows,
                                         int64_t n0) {
  const int64_t k = p.k, k8 = k - k % kLanes;
  int64_t i = 0;
  if (rows == kTile) {
    const float *w0 = wr[0], *w1 = wr[1], *w2 = wr[2], *w3 = wr[3];
    // Two x rows by four weight rows: eight accumulators, six loads per
    // eight multiply-adds (FMA-bound rather than load-bound).
    for (; i + 2 <= p.m; i += 2) {
      const float* xa = p.x + i * k;
      const float* xb = xa + k;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      for (int64_t j = 0; j < k8; j += kLanes) {
        const __m256 xva = _mm256_loadu_ps(xa + j), xvb = _mm256_loadu_ps(xb + j);
        const __m256 v0 = _mm256_loadu_ps(w0 + j), v1 = _mm256_loadu_ps(w1 + j);
        const __m256 v2 = _mm256_loadu_ps(w2 + j), v3 = _mm256_loadu_ps(w3 + j);
        a0 = _mm256_fmadd_ps(xva, v0, a0);
        a1 = _mm256_fmadd_ps(xva, v1, a1);
        a2 = _mm256_fmadd_ps(xva, v2, a2);
        a3 = _mm256_fmadd_ps(xva, v3, a3);
        b0 = _mm256_fmadd_ps(xvb, v0, b0);
        b1 = _mm256_fmadd_ps(xvb, v1, b1);
        b2 = _mm256_fmadd_ps(xvb, v2, b2);
        b3 = _mm256_fmadd_ps(xvb, v3, b3);
      }
      float* oa = p.out + i * p.n_total + n0;
      float* ob = oa + p.n_total;
      oa[0] = add_tail(lane_sum(a0), xa, w0, k8, k);
      oa[1] = add_tail(lane_sum(a1), xa, w1, k8, k);
      oa[2] = add_tail(lane_sum(a2), xa, w2, k8, k);
      oa[3] = add_tail(lane_sum(a3), xa, w3, k8, k);
      ob[0] = add_tail(lane_sum(b0), xb, w0, k8, k);
      ob[1] = add_tail(lane_sum(b1), xb, w1, k8, k);
      ob[2] = add_tail(lane_sum(b2), xb, w2, k8, k);
      ob[3] = add_tail(lane_sum(b3), xb, w3, k8, k);
    }
  }
  // The last odd x row of a full tile: four independent accumulators (one
  // would serialize on the FMA latency).
  if (rows == kTile && i < p.m) {
    const float* xi = p.x + i * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < k8; j += kLanes) {
      const __m256 xv = _mm256_loadu_ps(xi + j);
      a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr[0] + j), a0);
      a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr[1] + j), a1);
      a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr[2] + j), a2);
      a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr[3] + j), a3);
    }
    float* oi = p.out + i * p.n_total + n0;
    oi[0] = add_tail(lane_sum(a0), xi, wr[0], k8, k);
    oi[1] = add_tail(lane_sum(a1), xi, wr[1], k8, k);
    oi[2] = add_tail(lane_sum(a2), xi, wr[2], k8, k);
    oi[3] = add_tail(lane_sum(a3), xi, wr[3], k8, k);
    ++i;
  }
  // A partial tile (the last columns): one accumulator per output.
  for (; i < p.m; ++i) {
    const float* xi = p.x + i * k;
    for (int64_t r = 0; r < rows; ++r) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t j = 0; j < k8; j += kLanes) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(xi + j), _mm256_loadu_ps(wr[r] + j), a);
      }
      p.out[i * p.n_total + n0 + r] = add_tail(lane_sum(a), xi, wr[r], k8, k);
    }
  }
}

#endif

// Output columns [n_begin, n_end): float32 weights are read in place, other
// formats decoded a tile at a time into `scratch` [kTile * k].
void run_columns(const Problem& p, const WeightRows& w, int64_t n_begin, int64_t n_end,
                 float* scratch) {
  const CpuIsa isa = cpu_isa();
  const bool fused = isa >= CpuIsa::kAvx2 && w.quant != nullptr && p.m <= kFusedMaxRows;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTile) {
    const int64_t rows = std::min(kTile, n_end - n0);
    // Each fused kernel gives its own ISA's tile order (batching invariance).
    if (fused && (isa >= CpuIsa::kAvx512 ? tile_quant_fused_avx512(p, *w.quant, n0, rows)
                                         : tile_quant_fused_avx2(p, *w.quant, n0, rows))) {
      continue;
    }
    const float* wr[kTile] = {};
    for (int64_t r = 0; r < rows; ++r) wr[r] = w.row(n0 + r, scratch + r * p.k);
    if (isa >= CpuIsa::kAvx512) {
      // float32 rows kPrefetchTiles ahead in this range, for the kernel to
      // prefetch (other formats are decoded into scratch on demand instead).
      const int64_t ahead = n0 + kPrefetchTiles * kTile;
      const float* next[kTile] = {};
      const bool prefetch = w.in_place() && ahead < n_end;
      for (int64_t r = 0; prefetch && r < kTile; ++r) {
        next[r] = w.f32 + std::min(ahead + r, n_end - 1) * p.k;  // a short last tile repeats a row
      }
      tile_avx512(p, wr, rows, n0, prefetch ? next : nullptr);
      continue;
    }
#if defined(__x86_64__)
    if (isa == CpuIsa::kAvx2) {
      tile_avx2(p, wr, rows, n0);
      continue;
    }
#endif
    tile_portable(p, wr, rows, n0);
  }
}

}  // namespace

const float* WeightRows::row(int64_t r, float* scratch) const {
  if (f32 != nullptr) return f32 + r * k;
  if (bf16 != nullptr) {
#if defined(__x86_64__)
    if (cpu_isa() != CpuIsa::kPortable) {
      widen_rows_avx2(bf16 + r * k, k, scratch);
      return scratch;
    }
#endif
    widen_rows_portable(bf16 + r * k, k, scratch);
    return scratch;
  }
  dequantize_row(quant->type, quant->row(r), k, scratch);
  return scratch;
}

void linear_rows_small(const at::Tensor& x, const WeightRows& w, int64_t n, at::Tensor& out) {
  const Problem p{x.const_data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), n};
  const int64_t tiles = (p.n_total + kTile - 1) / kTile;
  // ~64K multiply-adds per task keeps small matrices on the calling thread.
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, p.k * p.m * kTile));
  parallel_for(0, tiles, grain, [&](int64_t t_begin, int64_t t_end) {
    const int64_t n_begin = t_begin * kTile, n_end = std::min(t_end * kTile, p.n_total);
    std::vector<float> scratch(w.in_place() ? 0 : static_cast<size_t>(kTile * p.k));
    run_columns(p, w, n_begin, n_end, scratch.data());
  });
}

void linear_rows_small_bf16_dot(const at::Tensor& x, const uint16_t* w, int64_t n,
                                at::Tensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  // Rounded once per call, not once per tile: every tile reads all of x.
  std::vector<uint16_t> xb(static_cast<size_t>(m * k));
  round_rows_to_bf16_avx512bf16(x.const_data_ptr<float>(), m * k, xb.data());
  const Bf16Problem p{xb.data(), out.data_ptr<float>(), m, k, n};
  const int64_t tiles = (n + kTile - 1) / kTile;
  // Half the float32 kernel's multiply-add instructions per tile, so twice
  // its tiles per task (same ~64K instructions).
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, k * m * kTile));
  parallel_for(0, tiles, grain, [&](int64_t t_begin, int64_t t_end) {
    const int64_t n_end = std::min(t_end * kTile, n);
    for (int64_t n0 = t_begin * kTile; n0 < n_end; n0 += kTile) {
      const int64_t rows = std::min(kTile, n_end - n0);
      const uint16_t* wr[kTile] = {};
      for (int64_t r = 0; r < rows; ++r) wr[r] = w + (n0 + r) * k;
      // As run_columns: the rows kPrefetchTiles tiles ahead, fetched meanwhile.
      const int64_t ahead = n0 + kPrefetchTiles * kTile;
      const uint16_t* next[kTile] = {};
      for (int64_t r = 0; ahead < n_end && r < kTile; ++r) {
        next[r] = w + std::min(ahead + r, n_end - 1) * k;
      }
      tile_avx512bf16(p, wr, rows, n0, ahead < n_end ? next : nullptr);
    }
  });
}

}  // namespace snapserve::kernels::cpu
