// The decoder layer's row-wise steps on CPU float32, one call each instead of
// the 4-8 LibTorch ops apiece they take when written as tensor expressions:
// RMSNorm, rotary embedding (in place) and the SwiGLU gate. At batch 1 a
// decode step of the default model runs ~100 such steps on 576-float rows, and
// the per-op dispatch and allocation cost more than the arithmetic
// (docs/quantized-weights.md, "Row-wise steps").
//
// Every row is computed alone, in one fixed order, whatever the row count, so
// results do not depend on what else is in the batch (docs/kv-cache-and-scheduling.md,
// "Batching invariance"). Formulas are transformers' (LlamaRMSNorm,
// apply_rotary_pos_emb, LlamaMLP's act_fn(gate) * up); the tests compare each
// with the LibTorch expression it replaces.
#pragma once

#include <ATen/core/Tensor.h>

#include <bit>
#include <cmath>
#include <cstdint>

namespace snapserve::kernels {

// x [m, n] float32, weight [n] float32 (CPU): weight * (x * rsqrt(mean(x^2) + eps)),
// the mean of squares summed in double. Returns a new [m, n] float32 tensor,
// or with out_dtype bfloat16 each float32 result rounded by
// bf16_bits_as_vcvtneps2bf16 (as silu_mul: the input the AMX GEMM would
// round it to, in half the bytes).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                    at::ScalarType out_dtype = at::kFloat);

// One row of rms_norm(x, weight, eps, kBFloat16): x and w n floats, out n
// bfloat16 values, the bits rms_norm writes there. For a caller that puts the
// row elsewhere than rms_norm's [m, n] output (the AMX GEMM's packed tiles,
// kernels/prefill_gemm/prefill_gemm_amx.h). scratch: n floats, used where the CPU lacks
// AVX512_BF16.
void rms_norm_row_bf16(const float* x, const float* w, int64_t n, float eps, float* scratch,
                       uint16_t* out);
// The float32 row of rms_norm(x, weight, eps): out n floats, the bits
// rms_norm writes there. For the int8 prompt GEMM, which quantizes the row
// as it is made (kernels/prefill_gemm/prefill_gemm_int8.h, Int8Input).
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out);

// x [m, heads, d] float32 with a contiguous last dimension (e.g. the q and k
// heads of a fused qkv output), cos/sin [m, d] float32 contiguous: rotates x
// in place, x * cos + rotate_half(x) * sin with rotate_half pairing i and
// i + d/2. Multiplies and adds round as the tensor expression does, so the
// result is bit for bit LibTorch's.
void rope_rotate_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// gate_up [m, 2 * inter] float32 contiguous (gate columns first): returns
// silu(gate) * up as a new [m, inter] tensor. gate_up may also be bfloat16
// (the bfloat16 prompt GEMM's product, kernels/linear/linear.h, linear_bf16_gemm):
// each row is widened as it is read, with the float32 input's bits, so the
// product's float32 copy is never written. The result is float32, or with
// out_dtype bfloat16 each float32 result rounded by
// bf16_bits_as_vcvtneps2bf16: what the AMX GEMM rounds its input to
// (kernels/prefill_gemm/prefill_gemm_amx.h), so that GEMM gives the float32 result's
// bits on half the bytes, and no pass converts them.
at::Tensor silu_mul(const at::Tensor& gate_up, at::ScalarType out_dtype = at::kFloat);

// One float32 row of silu_mul on a float32 gate_up: out[i] = silu(gate[i]) *
// up[i] for i < n, the bits silu_mul writes there. For the int8 prompt GEMM
// (kernels/prefill_gemm/prefill_gemm_int8.h, Int8Input).
void silu_mul_row(const float* gate, const float* up, int64_t n, float* out);

// The bfloat16 bits vcvtneps2bf16 gives for v: rounded to nearest even,
// subnormals (and zeros) to a zero of their sign, NaNs quieted and cut.
inline uint16_t bf16_bits_as_vcvtneps2bf16(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  if ((bits & 0x7F800000u) == 0) return static_cast<uint16_t>((bits & 0x80000000u) >> 16);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits | 0x00400000u) >> 16);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

namespace cpu {
// A gate or up value as float32: itself, or a bfloat16's bits shifted up
// (exact).
inline float widen(float v) { return v; }
inline float widen(uint16_t bf16_bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16_bits) << 16);
}
// silu(gate) * up = gate / (1 + exp(-gate)) * up with libm's exp: the
// portable loop, and the scalar tails of the AVX2 and AVX-512 rows.
template <typename T>
inline float silu_mul_scalar(T gate, T up) {
  const float g = widen(gate);
  return g / (1.0f + std::exp(-g)) * widen(up);
}

// out[i] = silu(gate[i]) * up[i] for i < n, eight at a time with
// simd::exp_avx2 (within 1 ulp of expf); returns false where the CPU path is
// portable (rowwise_cpu_avx2.cc).
bool silu_mul_row_avx2(const float* gate, const float* up, int64_t n, float* out);
// The same on bfloat16 gate and up, widened as they are read: the bits of
// the float32 call on their widening.
bool silu_mul_row_avx2(const uint16_t* gate, const uint16_t* up, int64_t n, float* out);

// RMSNorm's sum of squares in double, in the one order every path uses: 16
// partial sums (element i goes to partial i % 16 while 16 remain), folded as
// p[j] + p[j + 8], then lanes k and k + 4, k and k + 2, 0 and 1; the last
// n % 16 squares are summed apart and added at the end. Sixteen chains, not
// one, so the adds' latency does not bound a row (docs/quantized-weights.md,
// "Row-wise steps"). Each square is exact in double.
inline double sum_of_squares_portable(const float* x, int64_t n) {
  double p[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) p[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  double tail = 0.0;
  for (; i < n; ++i) tail += static_cast<double>(x[i]) * x[i];
  double c[8], d[4];
  for (int j = 0; j < 8; ++j) c[j] = p[j] + p[j + 8];
  for (int k = 0; k < 4; ++k) d[k] = c[k] + c[k + 4];
  return ((d[0] + d[2]) + (d[1] + d[3])) + tail;
}

// 1 / sqrt(mean of squares + eps), the mean rounded to float first.
inline float rms_scale(double squares, int64_t n, float eps) {
  const float mean = static_cast<float>(squares / static_cast<double>(n));
  return 1.0f / std::sqrt(mean + eps);
}

// One row of rms_norm, and one row of rope_rotate_ (all its `heads` heads of
// d floats at head_stride), 16 lanes at a time: the portable loops' bits
// (rowwise_cpu_avx512_nocontract.cc). Return false where this build lacks AVX-512.
bool rms_norm_row_avx512(const float* x, const float* w, int64_t n, float eps, float* out);
// The same row rounded by vcvtneps2bf16 as it is stored (AVX512_BF16 CPUs,
// has_avx512_bf16).
bool rms_norm_row_avx512bf16(const float* x, const float* w, int64_t n, float eps, uint16_t* out);
bool rope_rotate_row_avx512(float* x, int64_t heads, int64_t head_stride, int64_t d,
                            const float* cos, const float* sin);
// silu_mul's rows 16 lanes at a time (simd::exp_avx512): the bits of
// silu_mul_row_avx2, and bfloat16 outputs rounded by vcvtneps2bf16. For
// CPUs with AVX512_BF16 (has_avx512_bf16): on the AMX Xeon VM, one thread,
// 512 x 1536 bfloat16 products, float32 rows took 0.53 ms against AVX2's
// 0.57, and bfloat16 rows 0.52 ms against 1.05 for AVX2 and a second
// rounding pass (rounding in AVX-512F integer operations instead of
// vcvtneps2bf16 took 0.69). Return false where this build lacks AVX-512.
bool silu_mul_row_avx512bf16(const float* gate, const float* up, int64_t n, float* out);
bool silu_mul_row_avx512bf16(const uint16_t* gate, const uint16_t* up, int64_t n, float* out);
bool silu_mul_row_avx512bf16(const float* gate, const float* up, int64_t n, uint16_t* out);
bool silu_mul_row_avx512bf16(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out);
}  // namespace cpu

}  // namespace snapserve::kernels
