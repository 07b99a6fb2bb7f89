// The bfloat16 prompt GEMM on AMX tiles: y = round_bf16(x) · wᵀ, products of
// bfloat16 pairs summed in float32 by tdpbf16ps, for prompt-sized x under
// PrefillGemm::kBFloat16 (kernels/prefill_gemm/prefill_gemm.h) on CPUs with AMX-BF16.
//
// Why our own and not oneDNN's (through at::linear): alone, on the default
// model's shapes, this kernel is not faster, but in the model a prompt is,
// because around oneDNN's GEMM went
//   - rounding x to bf16 in a pass of its own (here: while packing x's tiles,
//     in the GEMM's parallel region, each thread its own rows);
//   - a bf16 product widened to float32 in another pass, and for o_proj and
//     down an add into the residual in a third (here: the epilogue writes
//     float32, adds into h, or writes bf16);
//   - an uneven split of the rows between the threads, one spinning in
//     libgomp while the other worked (here: 32-row blocks, split evenly).
// The weight is packed once at load as the tiles tdpbf16ps reads.
// docs/quantized-weights.md, "The prompt GEMM on AMX tiles".
//
// Numbers: every output element is the float32 sum of its k products in one
// fixed order (32-wide steps along k, tdpbf16ps's pairs within), whatever m
// is and however rows are split between threads, so a row's bits do not
// depend on the rows beside it (batching invariance and chunked prefill keep
// holding).
#pragma once

#include <ATen/core/Tensor.h>

namespace snapserve::kernels {

// The output block of one tile loop: 32 rows x 32 columns (2 x 2 tiles).
inline constexpr int64_t kAmxGemmBlock = 32;

// Whether a weight [n, k] can take this GEMM: AMX-BF16 usable (cpu_isa at
// kAmx), n a multiple of 32 and k of 32.
bool amx_gemm_fits(int64_t n, int64_t k);

// w [n, k] float32 or bfloat16 (the nn.Linear layout), rounded to bfloat16
// (to nearest even) and laid out as tdpbf16ps's B tiles:
// [n / 16][k / 32][16 pairs along k][16 columns][2], bfloat16.
at::Tensor pack_amx_weight(const at::Tensor& w);

// What the GEMM does with its float32 product.
enum class AmxOut {
  kFloat32,   // returns it as a new [m, n] float32 tensor
  kBFloat16,  // returns it rounded to bfloat16 (to nearest even)
};

// An RMSNorm the products take their x through: x's rows become
// rms_norm(x, *weight, eps, kBFloat16)'s (kernels/rowwise/rowwise.h), the same bits,
// computed as each thread packs its rows into tiles. That saves the [m, k]
// pass rms_norm's output would cost, written out and read back by the
// packing (docs/quantized-weights.md, "The prompt GEMM on AMX tiles").
// weight nullptr: x as it is.
struct AmxRowNorm {
  const at::Tensor* weight = nullptr;  // [k] float32, CPU
  double eps = 0.0;
};

// x [m, k] float32 (rounded to bfloat16 here) or bfloat16, CPU; packed from
// pack_amx_weight. Returns [m, n]. With a norm, x must be float32.
at::Tensor linear_amx(const at::Tensor& x, const at::Tensor& packed, AmxOut out,
                      const AmxRowNorm& norm = {});

// h [m, n] float32, contiguous: h += x · wᵀ, the product added as it leaves
// the tiles (no [m, n] temporary).
void linear_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& packed);

// x [m, k] already laid out as the GEMM's tiles (cpu::pack_amx_rows' layout),
// each row rounded to bfloat16 as the packing would round it: written so by
// its producer, the product skips its packing pass. The AMX prompt attention
// writes o_proj's input so (kernels/prefill_attention/prefill_attention.h,
// prefill_attention_amx_packed): the f32 output it would write and the
// packing would read back were ~2x the bytes of these tiles
// (docs/quantized-weights.md, "The prompt GEMM on AMX tiles").
struct AmxPackedRows {
  at::Tensor tiles;  // bfloat16, round_up(m, 32) * k elements, rows past m zero
  int64_t m = 0, k = 0;
};

// Room for m rows of k (a multiple of 32) on the CPU, its padding rows zero.
AmxPackedRows empty_amx_packed_rows(int64_t m, int64_t k);

// Where element (row, col) of x [m, k] lies in AmxPackedRows' tiles: tiles of
// 16 rows x 32 columns, a 16-row block's k / 32 tiles one after another.
inline int64_t amx_packed_offset(int64_t k, int64_t row, int64_t col) {
  return (row / 16) * (k / 32) * 512 + (col / 32) * 512 + (row % 16) * 32 + col % 32;
}

// h += x · wᵀ for x packed already.
void linear_amx_add_(at::Tensor& h, const AmxPackedRows& x, const at::Tensor& packed);

// Whether the SwiGLU MLP of gate_up [2 * inter, k] and down [k, inter] can
// take mlp_amx_add_: both fit, and inter is a multiple of 32.
bool amx_mlp_fits(int64_t inter, int64_t k);

// h [m, k] float32, contiguous: h += silu(gate) * up · downᵀ, with gate and
// up the two halves of x · gate_upᵀ (x [m, k] float32 or bfloat16), both
// packed by pack_amx_weight. What
//   linear_amx_add_(h, silu_mul(linear_amx(x, gate_up, kBFloat16), kBFloat16), down)
// computes, without its three passes over [m, 2 * inter]: the gate runs in
// the gate/up product's epilogue, on a block of 16 gate and 16 up columns
// still in cache, and writes down's x already packed as its tiles
// (docs/quantized-weights.md, "The MLP in one pass"). The gate is computed
// to ~7e-5 rather than silu_mul's float32 exactness (each of down's bf16
// inputs within one rounding step of silu_mul's), in fewer instructions,
// which on AMX add to the tile products' time.
// With a norm, x may be h itself (the decoder layer's
// h += MLP(RMSNorm(h))): each thread packs its rows before any product
// writes them.
void mlp_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& gate_up,
                  const at::Tensor& down, const AmxRowNorm& norm = {});

namespace cpu {

// Where one call's product goes (prefill_gemm_cpu_amx_nocontract.cc).
enum class AmxEpilogue {
  kStoreFloat32,
  kAddFloat32,
  kStoreBFloat16,
  // The product is [gate, up] (n = 2 * inter): column block cb pairs gate
  // columns cb * 16.. with the up columns beside them, and writes
  // silu_mul's bf16 result at columns cb * 16.. of [m_padded, inter], laid
  // out as pack_amx_rows lays out x (the down product's input).
  kSwiGluPacked,
};

struct AmxGemmArgs {
  const uint16_t* x = nullptr;  // pack_amx_rows' tiles of x, rows past m zero
  const uint16_t* w = nullptr;  // pack_amx_weight's layout
  void* out = nullptr;          // [m, n] float32 or bf16, or packed (epilogue)
  int64_t m = 0, n = 0, k = 0;
  AmxEpilogue epilogue = AmxEpilogue::kStoreFloat32;
};

// Rows [row0, row1) of x [m, k] (float32 x, rounded to bfloat16 to nearest
// even, or bfloat16 x_bf16) into dst as tiles of 16 rows x 32 k values:
// [rows / 16][k / 32][16][32] bf16; rows at or past m are zero. row0 and row1
// are multiples of 16.
void pack_amx_rows(const float* x, const uint16_t* x_bf16, int64_t m, int64_t k, int64_t row0,
                   int64_t row1, uint16_t* dst);
// One bfloat16 row of k values to row `row` of pack_amx_rows' layout in dst.
void pack_amx_row(const uint16_t* row_bf16, int64_t k, int64_t row, uint16_t* dst);

// Output blocks [block_begin, block_end) of the (m_padded / 32) x (n / 32)
// grid, numbered row block major; on one pool thread.
void gemm_amx_blocks(const AmxGemmArgs& a, int64_t row_block_begin, int64_t row_block_end,
                     int64_t col_block_begin, int64_t col_block_end);

}  // namespace cpu
}  // namespace snapserve::kernels
