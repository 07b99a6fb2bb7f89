// Checks and path choice for the CPU linear; the fixed-order kernel lives in
// linear_cpu.cc.
#include "kernels/linear/linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "kernels/checks.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_team.h"
#include "kernels/linear/linear_cpu_tiles.h"
#include "kernels/quant_dot/quant_dot.h"

namespace snapserve::kernels {

namespace {

// x (float32) rounded to bfloat16, to nearest even, for the bfloat16 GEMM:
// by vcvtneps2bf16 where the CPU has it, else by ATen. ATen's conversion takes
// its AVX2 path (no such instruction there), several instructions per value
// (docs/quantized-weights.md, "The bfloat16 prompt GEMM"). The two agree
// but for subnormal inputs, which vcvtneps2bf16 takes as 0.
at::Tensor to_bfloat16(const at::Tensor& x) {
  if (!has_avx512_bf16()) return x.to(at::kBFloat16);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty(xc.sizes(), xc.options().dtype(at::kBFloat16));
  const float* src = xc.const_data_ptr<float>();
  auto* dst = static_cast<uint16_t*>(out.data_ptr());
  cpu::parallel_for(0, xc.numel(), int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    cpu::round_rows_to_bf16_avx512bf16(src + begin, end - begin, dst + begin);
  });
  return out;
}

// Float32 weight rows widened or decoded per GEMM call at large m: ~2 MiB, so
// a slice stays in cache between its widening and its use.
constexpr int64_t kSliceElements = int64_t{1} << 19;

// x · wᵀ through LibTorch's GEMM of `gemm`'s precision, the weight rows
// [r, r + rows) made float32 by `slice(r, rows)` a cache-sized slice at a
// time (and rounded to bfloat16 for kBFloat16; a bfloat16 weight's slice is
// taken as it is).
template <typename Slice>
at::Tensor linear_large(const at::Tensor& x, int64_t n, int64_t k, PrefillGemm gemm,
                        const Slice& slice) {
  const int64_t m = x.size(0);
  const bool bf16 = gemm == PrefillGemm::kBFloat16;
  const at::Tensor xg = bf16 ? to_bfloat16(x) : x;
  auto product = [&](const at::Tensor& w) {
    return bf16 ? at::linear(xg, w.to(at::kBFloat16)).to(at::kFloat) : at::linear(xg, w);
  };
  const int64_t rows_per_slice = std::max<int64_t>(1, kSliceElements / std::max<int64_t>(k, 1));
  if (rows_per_slice >= n) return product(slice(0, n));
  at::Tensor out = at::empty({m, n}, x.options());
  for (int64_t r = 0; r < n; r += rows_per_slice) {
    const int64_t rows = std::min(rows_per_slice, n - r);
    out.narrow(1, r, rows).copy_(product(slice(r, rows)));
  }
  return out;
}

void check_activations(const at::Tensor& x) {
  check_shape(x, "x", {-1, -1});
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x: expected float32, got ", x.scalar_type());
  TORCH_CHECK(x.is_cpu(), "linear: CPU only (on CUDA the model uses at::linear)");
}

// Integer block dot products (quant_dot.h), parallel over tiles of weight rows.
void int8_linear(const at::Tensor& x, const QuantMatrix& w, at::Tensor& out) {
  cpu::QuantizedRows xq = cpu::quantize_rows(x.const_data_ptr<float>(), x.size(0), x.size(1));
  float* dst = out.data_ptr<float>();
  const CpuIsa isa = cpu_isa();
  if (isa >= CpuIsa::kAvx512Vnni) cpu::arrange_for_vnni(xq);
  // ~64K multiply-adds per task, as the float32 kernel.
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, w.cols * xq.m));
  cpu::parallel_for(0, w.rows, grain, [&](int64_t begin, int64_t end) {
    if (isa >= CpuIsa::kAvx512Vnni && cpu::int8_dot_avx512vnni(w, xq, begin, end, dst, w.rows)) {
      return;
    }
    if (isa >= CpuIsa::kAvx2 && cpu::int8_dot_avx2(w, xq, begin, end, dst, w.rows)) return;
    cpu::int8_dot_portable(w, xq, begin, end, dst, w.rows);
  });
}

}  // namespace

at::Tensor linear_float32(const at::Tensor& x, const at::Tensor& w, PrefillGemm gemm,
                          DecodeDot dot) {
  check_activations(x);
  check_shape(w, "w", {-1, x.size(1)});
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16,
              "w: expected float32 or bfloat16, got ", w.scalar_type());
  TORCH_CHECK(w.is_cpu(), "linear: CPU only (on CUDA the model uses at::linear)");
  TORCH_CHECK(w.is_contiguous(), "w: expected a contiguous weight");
  const at::Tensor xc = x.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  if (xc.size(0) > kLinearSmallRows) {
    if (w.scalar_type() == at::kFloat && gemm == PrefillGemm::kFloat32) return at::linear(xc, w);
    if (w.scalar_type() == at::kBFloat16 && gemm == PrefillGemm::kBFloat16) {
      // Already in the GEMM's precision: one product, no slices to stage.
      return linear_bf16_gemm(xc, w).to(at::kFloat);
    }
    // A bfloat16 slice stays bfloat16 for the bfloat16 GEMM.
    const at::ScalarType slice_dtype =
        gemm == PrefillGemm::kBFloat16 ? w.scalar_type() : at::kFloat;
    return linear_large(xc, n, k, gemm, [&](int64_t r, int64_t rows) {
      return w.narrow(0, r, rows).to(slice_dtype);
    });
  }
  at::Tensor out = at::empty({xc.size(0), n}, xc.options());
  if (xc.size(0) == 0 || n == 0) return out;
  if (w.scalar_type() == at::kFloat) {
    cpu::WeightRows rows;
    rows.k = k;
    rows.f32 = w.const_data_ptr<float>();
    cpu::linear_rows_small(xc, rows, n, out);
    return out;
  }
  const auto* w_bits = static_cast<const uint16_t*>(w.const_data_ptr());
  if (dot == DecodeDot::kBFloat16 && has_avx512_bf16()) {
    cpu::linear_rows_small_bf16_dot(xc, w_bits, n, out);
    return out;
  }
  cpu::WeightRows rows;
  rows.k = k;
  rows.bf16 = w_bits;
  // Without AVX512_BF16 the bfloat16 dot is emulated: x rounded the same
  // way, then the float32 kernel (each product of two bfloat16 values is
  // exact in float32; only the order of the float32 sums differs).
  const at::Tensor xr = dot == DecodeDot::kBFloat16 ? xc.to(at::kBFloat16).to(at::kFloat) : xc;
  cpu::linear_rows_small(xr, rows, n, out);
  return out;
}

at::Tensor linear_bf16_gemm(const at::Tensor& x, const at::Tensor& w) {
  check_activations(x);
  check_shape(w, "w", {-1, x.size(1)});
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_cpu() && w.is_contiguous(),
              "linear_bf16_gemm: expected a contiguous bfloat16 CPU weight");
  return at::linear(to_bfloat16(x.contiguous()), w);
}

at::Tensor linear_quantized(const at::Tensor& x, const QuantMatrix& w, QuantDot dot,
                            PrefillGemm gemm) {
  check_activations(x);
  TORCH_CHECK(x.size(1) == w.cols, "x: expected ", w.cols, " columns (the weight's), got ",
              x.size(1));
  const at::Tensor xc = x.contiguous();
  if (xc.size(0) > kLinearSmallRows) {
    return linear_large(xc, w.rows, w.cols, gemm, [&](int64_t r, int64_t rows) {
      at::Tensor slice = at::empty({rows, w.cols}, at::kFloat);
      float* dst = slice.data_ptr<float>();
      cpu::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          dequantize_row(w.type, w.row(r + i), w.cols, dst + i * w.cols);
        }
      });
      return slice;
    });
  }
  at::Tensor out = at::empty({xc.size(0), w.rows}, xc.options());
  if (dot == QuantDot::kInt8 && has_int8_dot(w.type) && xc.size(0) > 0) {
    int8_linear(xc, w, out);
    return out;
  }
  cpu::WeightRows rows;
  rows.k = w.cols;
  rows.quant = &w;
  if (xc.size(0) > 0 && w.rows > 0) cpu::linear_rows_small(xc, rows, w.rows, out);
  return out;
}

}  // namespace snapserve::kernels
