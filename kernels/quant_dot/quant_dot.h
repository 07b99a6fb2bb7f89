// The CPU linear on legacy GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) the
// way the formats' dot products are defined: each activation row is
// quantized per 32-element block to int8 with one float scale (Q8_0-style),
// and every (weight block, activation block) pair is an exact integer dot
// product scaled by the two blocks' float scales. No weight is ever widened
// to float, so a decode step costs a few integer instructions per 32 weights
// instead of decoding each weight (kernels/linear/linear.h, QuantDot::kInt8).
//
// Arithmetic, identical on every SIMD path (the AVX2 path reproduces the
// portable one bit for bit): per output, eight float32 lanes; block b's exact
// integer dot product (all 32 products summed in int32) goes to lane b % 8:
// lane += (d_w * d_x) * float(sum), then for Q4_1/Q5_1 lane += m_w * (d_x *
// sum_b q_x), each a multiply then an add (never fused), blocks in order; the
// lanes are summed in the fixed tree of kernels/cpu/x86/simd_sums.h. A row's result
// therefore does not depend on the batch. (One float term per block, not per
// 4 elements: the eight blocks of a vector step share one scaling, so the
// float work is one multiply-add chain per eight blocks.)
//
// Accuracy: the only error beyond float32 rounding is the activations'
// quantization, |x - d_x q_x| <= d_x / 2 = max|x_block| / 254 per element;
// tests/python/test_quant_blocks.py checks the resulting bound per output.
// Layouts: docs/quantized-weights.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/quant/quant_matrix.h"

namespace snapserve::kernels {

// Whether `type` has an integer dot product here (else the linear decodes).
bool has_int8_dot(QuantType type);

namespace cpu {

// Activation rows quantized per 32-element block.
struct QuantizedRows {
  int64_t m = 0, k = 0, blocks = 0;  // blocks = k / 32 per row
  std::vector<int8_t> q;             // [m, k]
  std::vector<float> d;              // [m, blocks] scale: max|x| / 127
  std::vector<float> s;              // [m, blocks] d * sum(q): for the offset term
  // The same q for the AVX-512 VNNI path, filled by arrange_for_vnni: per row,
  // per group of eight blocks (the last one zero-padded), four 64-byte pairs;
  // pair p holds blocks 8g + p and 8g + p + 4 as their elements 0..15, 0..15,
  // 16..31, 16..31 (the order in which that path unpacks two weight blocks
  // into one register). vnni_sums: each block's integer sum(q), 0 past the
  // row, eight per group (the path's bias correction).
  int64_t vnni_groups = 0;
  std::vector<int8_t> vnni_q;      // [m, vnni_groups, 256]
  std::vector<int32_t> vnni_sums;  // [m, vnni_groups, 8]
};

// x [m, k] contiguous float32, k a multiple of 32.
QuantizedRows quantize_rows(const float* x, int64_t m, int64_t k);

// The quantization itself, `blocks` consecutive 32-blocks of x into q
// [blocks * 32], d and s [blocks]. The AVX-512 one gives the same bits and
// returns false when this build lacks it (the prompt GEMM,
// kernels/prefill_gemm/prefill_gemm_int8.h, quantizes a prompt's rows with it in parallel).
void quantize_blocks_portable(const float* x, int64_t blocks, int8_t* q, float* d, float* s);
bool quantize_blocks_avx512(const float* x, int64_t blocks, int8_t* q, float* d, float* s);

// Fills xq's vnni_* fields from its q (once per linear call, before the
// parallel rows).
void arrange_for_vnni(QuantizedRows& xq);

// out[i * n_total + r] for weight rows [r_begin, r_end) of w and every row of
// xq. Portable, AVX2 and AVX-512 VNNI (the SIMD ones return false when they
// cannot: not an x86-64 build, a type without an int8 dot, or for VNNI rows
// not arranged_for_vnni).
void int8_dot_portable(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin,
                       int64_t r_end, float* out, int64_t n_total);
bool int8_dot_avx2(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin, int64_t r_end,
                   float* out, int64_t n_total);
bool int8_dot_avx512vnni(const QuantMatrix& w, const QuantizedRows& xq, int64_t r_begin,
                         int64_t r_end, float* out, int64_t n_total);

}  // namespace cpu
}  // namespace snapserve::kernels
