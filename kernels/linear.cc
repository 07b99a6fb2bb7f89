// Checks and path choice for the CPU linear; the fixed-order kernel lives in
// linear_cpu.cc.
#include "kernels/linear.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "kernels/checks.h"

namespace snapserve::kernels {

namespace {

// Float32 weight rows widened per GEMM call for bfloat16 weights at large m:
// ~2 MiB, so a slice stays in cache between its widening and its use.
constexpr int64_t kSliceElements = int64_t{1} << 19;

at::Tensor linear_large(const at::Tensor& x, const at::Tensor& w) {
  if (w.scalar_type() == at::kFloat) return at::linear(x, w);
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  const int64_t rows_per_slice = std::max<int64_t>(1, kSliceElements / std::max<int64_t>(k, 1));
  if (rows_per_slice >= n) return at::linear(x, w.to(at::kFloat));
  at::Tensor out = at::empty({m, n}, x.options());
  for (int64_t r = 0; r < n; r += rows_per_slice) {
    const int64_t rows = std::min(rows_per_slice, n - r);
    out.narrow(1, r, rows).copy_(at::linear(x, w.narrow(0, r, rows).to(at::kFloat)));
  }
  return out;
}

}  // namespace

at::Tensor linear_float32(const at::Tensor& x, const at::Tensor& w) {
  check_shape(x, "x", {-1, -1});
  check_shape(w, "w", {-1, x.size(1)});
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x: expected float32, got ", x.scalar_type());
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16,
              "w: expected float32 or bfloat16, got ", w.scalar_type());
  TORCH_CHECK(x.is_cpu() && w.is_cpu(), "linear: CPU only (on CUDA the model uses at::linear)");
  TORCH_CHECK(w.is_contiguous(), "w: expected a contiguous weight");
  const at::Tensor xc = x.contiguous();
  if (xc.size(0) > kLinearSmallRows) return linear_large(xc, w);
  at::Tensor out = at::empty({xc.size(0), w.size(0)}, xc.options());
  if (xc.size(0) > 0 && w.size(0) > 0) cpu::linear_float32_small(xc, w, out);
  return out;
}

}  // namespace snapserve::kernels
