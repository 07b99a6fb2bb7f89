// Causal attention of a prompt chunk, three kernels of one design:
// - bfloat16 products on Intel's AMX tiles (tdpbf16ps, Sapphire Rapids on;
//   kernels/cpu/cpu_isa.h, kAmx): the attention half of `--prefill-gemm=bfloat16`
//   and `int8` (docs/quantized-weights.md, "Which path runs where") where
//   the CPU has them, head size 64;
// - bfloat16 products on CPUs with AVX512_BF16 (vdpbf16ps): the same, where
//   vdpbf16ps outpaces FMA (AMD's CPUs: kernels/cpu/cpu_isa.h,
//   bf16_dot_outpaces_fma);
// - float32 products on the other AVX-512F CPUs (Ice Lake, Skylake-SP, and
//   Intel's with AVX512_BF16, where it is the faster of the two), for the
//   same prompt precisions: more exact than the bfloat16 kernel, and faster
//   than LibTorch's float32 attention, which repeats K and V per query head
//   (docs/quantized-weights.md, "Prompt attention").
//
// Why a kernel of our own: LibTorch's CPU flash attention multiplies in
// float32 through MKL, whose sgemm takes its AVX2 path on AMD; at a 2,048-token
// prompt of the default model that attention is the larger part of the
// prefill once the linears take a low-precision GEMM. Its bfloat16 variant
// is no faster on CPUs without AMX, and on AMX its rows depend on the chunk
// around them (docs/quantized-weights.md, "Paths not taken").
//
// Numbers (both bfloat16 kernels): q·scale, k, v and the softmax weights are
// rounded to bfloat16 (round to nearest even); every product is accumulated in float32, the
// running max, the softmax sums and the output stay float32 (the online
// softmax of FlashAttention: one pass over the keys). Keys a query may not see
// (causality) get weight exactly 0.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/prefill_gemm/prefill_gemm_amx.h"

namespace snapserve::kernels {

// Whether prefill_attention_bf16 runs here: AVX512_BF16 in the CPU and a
// kernel ISA cap (SNAPSERVE_CPU_ISA, kernels/cpu/cpu_isa.h) of avx512vnni, the
// widest level. Head sizes 64 and 128 only (every Llama/Mistral shape we
// serve); otherwise callers keep LibTorch's attention.
bool has_prefill_attention_bf16(int64_t head_dim);

// q [H, rows, D], k and v [Hkv, keys, D], float32 on the CPU, H a multiple of
// Hkv (grouped-query attention: query head h reads KV head h / (H / Hkv)),
// rows <= keys. Query row r sits at position keys - rows + r and sees keys
// 0 .. keys - rows + r. Returns the attention output [H, rows, D], float32,
// as a view of a contiguous [rows, H, D] tensor: transposed back, it is the
// o_proj's input [rows, H * D] with no copy (a copy was 2.7 % of a
// 2,048-token prefill). The same for every kernel below.
at::Tensor prefill_attention_bf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scale);

// Whether prefill_attention_amx runs here: the ISA level amx
// (kernels/cpu/cpu_isa.h: AMX tiles, and no SNAPSERVE_CPU_ISA cap below it) and
// head size 64. (At 128 the outputs of 16 rows would need all 8 tile
// registers; that shape keeps the other kernels.)
bool has_prefill_attention_amx(int64_t head_dim);

// As prefill_attention_bf16, the same roundings, the products on AMX tiles.
at::Tensor prefill_attention_amx(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale);

// prefill_attention_amx's output as o_proj's AMX GEMM takes it: [rows, H * D]
// rounded to bfloat16 in the GEMM's tiles (kernels/prefill_gemm/prefill_gemm_amx.h), the
// bits the GEMM's packing would make of prefill_attention_amx's float32
// output, without writing that output and reading it back.
AmxPackedRows prefill_attention_amx_packed(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double scale);

// Whether prefill_attention_f32 runs here: a kernel ISA of avx512 or wider
// (kernels/cpu/cpu_isa.h) and head size 64 or 128.
bool has_prefill_attention_f32(int64_t head_dim);

// As prefill_attention_bf16, with nothing rounded below float32: q·scale, k,
// v and the weights are float32, every product one FMA into a float32 sum.
at::Tensor prefill_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale);

namespace cpu {

// The kernels' sizes: a work item is group_rows query rows of one head
// (prefill_attention_group_rows for the AVX-512 kernels, 16 for AMX's
// tiles), rows_padded is rows rounded up to whole groups, tiles the 32-key
// tiles of the keys.
struct AttentionShape {
  int64_t heads = 0, kv_heads = 0, rows = 0, rows_padded = 0, keys = 0, tiles = 0, dim = 0,
          group_rows = 0;
};

// Operands laid out for vdpbf16ps and tdpbf16ps (prefill_attention.cc packs
// them):
// q_pairs [H][rows_padded][D/2] bf16 pairs of q·scale (as uint32);
// k_tiles [Hkv][tiles][D/2][32 keys][2] bf16 (a tile is 32 keys, padded with 0);
// v_pairs [Hkv][tiles·16][D][2] bf16: keys 2s and 2s + 1 side by side.
// o_proj_tiles: where the AMX kernel writes its output instead of `out`
// when set: [rows, H * D] as AmxPackedRows' tiles (prefill_attention_amx_packed).
struct PackedAttention : AttentionShape {
  const uint32_t* q_pairs = nullptr;
  const uint16_t* k_tiles = nullptr;
  const uint16_t* v_pairs = nullptr;
  uint16_t* o_proj_tiles = nullptr;
};

// Operands of the float32 kernel (prefill_attention.cc packs them):
// q [H][rows_padded][D] of q·scale; k_tiles [Hkv][tiles][D][32 keys]
// (a tile is 32 keys, padded with 0); v_rows [Hkv][tiles·32][D].
struct PackedAttentionF32 : AttentionShape {
  const float* q = nullptr;
  const float* k_tiles = nullptr;
  const float* v_rows = nullptr;
};

// Rows per work item of the AVX-512 kernels (the AMX kernel's:
// kAmxGroupRows). Items are head-major; within a head they alternate
// between the first and the last groups not yet taken (0, G-1, 1, G-2, ...), so any run of items
// holds cheap (early) and dear (late) rows of the causal triangle alike and the threads' contiguous
// shares cost the same even when a head is split.
int64_t prefill_attention_group_rows(int64_t head_dim);

// Where output row `row` of query head `head` goes in the kernels' `out`
// (prefill_attention_bf16's [rows, H, D] layout).
inline float* output_row(const AttentionShape& s, float* out, int64_t head, int64_t row) {
  return out + (row * s.heads + head) * s.dim;
}

// dst[i] = bfloat16 bits of src[i] * scale, rounded to nearest even (as
// c10::BFloat16; subnormal inputs become 0). n a multiple of 16.
void round_to_bf16_avx512bf16(const float* src, float scale, uint16_t* dst, int64_t n);
// One 32-key tile of k and v as PackedAttention lays them out: n <= 32 rows
// of each (row i at k + i · k_stride, v + i · v_stride, dim floats), rounded
// to bf16 into k_dst (dim / 2 x 32 pairs) and v_dst (16 x dim pairs); keys
// n .. 31 are 0.
void pack_kv_tile_avx512bf16(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                             int64_t n, int64_t dim, uint16_t* k_dst, uint16_t* v_dst);
void prefill_attention_avx512bf16(const PackedAttention& p, int64_t item_begin, int64_t item_end,
                                  float* out);
void prefill_attention_avx512(const PackedAttentionF32& p, int64_t item_begin, int64_t item_end,
                              float* out);
// Rows per work item of the AMX kernel: one tile's 16 rows.
inline constexpr int64_t kAmxGroupRows = 16;
void prefill_attention_amx(const PackedAttention& p, int64_t item_begin, int64_t item_end,
                           float* out);

}  // namespace cpu

}  // namespace snapserve::kernels
