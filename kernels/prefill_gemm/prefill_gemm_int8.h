// The prompt GEMM on GGUF blocks with int8 products (PrefillGemm::kInt8):
// y = x · wᵀ for prompt-sized x, where w's legacy blocks (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0) are repacked once, at load, into "panels" that AVX-512 VNNI
// multiplies without unpacking anything in the inner loop.
//
// Why: a vpdpbusd (64 u8 x s8 products per instruction) does twice the
// multiply-adds of a vdpbf16ps per cycle on AVX-512 VNNI CPUs without AMX
// (Zen 4, Zen 5), and the bfloat16 GEMM is what vLLM-CPU uses, so the int8
// products are the way to prefill faster than it there.
//
// Arithmetic. Every weight of a 32-block is w = scale · u + offset with u an
// unsigned byte (Q4_1/Q5_1: u = q, offset = m; Q4_0/Q5_0/Q8_0: u = q + bias,
// offset = -bias · scale; exactly the file's value, as decoded by gguf-py up
// to its float rounding). The activations are quantized per 32-block as the
// decode dot product does (kernels/quant_dot/quant_dot.h: x ≈ d_x · q_x, s_x = d_x ·
// sum(q_x)). Then per output, blocks in order:
//   acc = fma(float(sum_j u_j · q_x,j), scale · d_x, acc)   (integer sum exact)
//   acc = fma(offset, s_x, acc)
// Every SIMD path and the portable one give the same bits (the portable one
// uses std::fma). The error against float64 is the activations' quantization
// (as quant_dot.h states it) plus float32 rounding of K/32 block terms;
// tests/python/test_prefill_gemm_int8.py checks the bound.
//
// Layout of a panel (32 weight rows; rows past n are zero): per block of 32
// columns, 8 quads g of 2 tiles t of [16 rows][4 bytes]: row 16t + r,
// columns 4g .. 4g + 3 of the block — the operand order of vpdpbusd, which
// sums four byte products into each of 16 int32 lanes. 4-bit types may be
// packed as nibbles instead (half the bytes, for decode, which reads every
// weight once per step): quads g and g + 4 share bytes, g in the low
// nibble. Scales: per block, the 32 rows' d and m as the file's float16
// (m = 0 for the signed types); offset = m - bias · d, exact in float32.
// The integer sums are exact whatever the layout, so both layouts give the
// same bits. Docs: docs/quantized-weights.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/quant/quant_matrix.h"

namespace snapserve::kernels {

inline constexpr int64_t kPanelRows = 32;
inline constexpr int64_t kPanelBlock = 32;  // columns per block, = the legacy block size

struct Int8Panels {
  int64_t n = 0, k = 0;            // the weight matrix's rows and columns
  int64_t panels = 0, blocks = 0;  // ceil(n / 32), k / 32
  bool nibbles = false;            // 4-bit layout
  float bias = 0.0f;               // 8, 16 or 128 for the signed types, else 0
  at::Tensor bytes;                // uint8 [panels, blocks, 8 (4 for nibbles), 2, 16, 4]
  at::Tensor scales;               // float16 [panels, blocks, 2, 32]: d, then m, per row

  int64_t block_bytes() const { return nibbles ? 512 : 1024; }
  int64_t nbytes() const { return bytes.nbytes() + scales.nbytes(); }
};

// Whether a matrix of `type` can be packed (the legacy block types), and
// whether as nibbles (Q4_0, Q4_1).
bool has_int8_panels(QuantType type);
bool has_nibble_panels(QuantType type);

// w's rows as panels; throws c10::Error for a type without them (or
// without nibbles, when asked for).
Int8Panels pack_int8_panels(const QuantMatrix& w, bool nibbles = false);

// What the GEMM multiplies: x's rows as they are, or the row-wise step that
// comes before the product in a decoder layer, applied to each row of x as
// the rows are quantized. The quantization then reads each row from a
// thread's scratch, not from an [m, k] float32 tensor that a separate pass
// wrote (docs/quantized-weights.md, "Int8 panels"). Same bits as that pass
// followed by the GEMM:
//   kRmsNorm  rms_norm(x, *norm_weight, eps)'s rows (kernels/rowwise/rowwise.h); x [m, k];
//   kSiluMul  silu_mul(x)'s rows; x [m, 2k], the gate's k columns first.
struct Int8Input {
  enum class Step { kNone, kRmsNorm, kSiluMul };
  Step step = Step::kNone;
  const at::Tensor* norm_weight = nullptr;  // kRmsNorm: [k] float32
  double eps = 0.0;                         // kRmsNorm

  static Int8Input rms_norm(const at::Tensor& weight, double eps) {
    return {Step::kRmsNorm, &weight, eps};
  }
  static Int8Input silu_mul() { return {Step::kSiluMul, nullptr, 0.0}; }
};

// x [m, k] float32 CPU -> [m, n] float32, on the path `isa` allows (VNNI or
// portable; both give the same bits). Parallel over panels. With an
// `input` step, the product of that step's rows (x [m, 2k] for kSiluMul).
at::Tensor linear_int8_panels(const at::Tensor& x, const Int8Panels& w, CpuIsa isa = cpu_isa(),
                              const Int8Input& input = {});

// linear_int8_panels written into out ([m, n] float32, contiguous, CPU):
// the same bits without allocating the result (a decode step reuses one
// buffer for every layer's qkv and gate_up products).
void linear_int8_panels_out(at::Tensor& out, const at::Tensor& x, const Int8Panels& w,
                            CpuIsa isa = cpu_isa(), const Int8Input& input = {});

// out += x · wᵀ in place (out [m, n] float32, contiguous, CPU): the bits of
// out.add_(linear_int8_panels(x, w)), each output's finished sum added once,
// without the intermediate tensor and the separate add (a decode step's
// residual adds: two per layer).
void linear_int8_panels_add_(at::Tensor& out, const at::Tensor& x, const Int8Panels& w,
                             CpuIsa isa = cpu_isa(), const Int8Input& input = {});

namespace cpu {

// Activation rows quantized per 32-block for the panels (quant_dot.h's
// quantize_blocks_*): q [m, k], d and s [m, k / 32].
struct PanelActivations {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  int64_t m = 0, k = 0;
};

// out[i * ldo + 32 p + r] for panels [p_begin, p_end) and every row i of x
// (only columns below w.n are written); with `accumulate`, the sum is added
// to what out holds.
void int8_panels_portable(const PanelActivations& x, const Int8Panels& w, int64_t p_begin,
                          int64_t p_end, float* out, int64_t ldo, bool accumulate);
bool int8_panels_avx512vnni(const PanelActivations& x, const Int8Panels& w, int64_t p_begin,
                            int64_t p_end, float* out, int64_t ldo, bool accumulate);

}  // namespace cpu
}  // namespace snapserve::kernels
