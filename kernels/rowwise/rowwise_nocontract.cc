#include "kernels/rowwise/rowwise.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/checks.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_team.h"

namespace snapserve::kernels {

namespace {

// Rows per parallel task: decode-sized calls (a few rows) stay on the calling
// thread, where waking the pool would cost more than the work.
int64_t RowGrain(int64_t row_elements) {
  constexpr int64_t kElementsPerTask = int64_t{64} * 1024;
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(row_elements, 1));
}

// One float32 row of rms_norm.
void RmsNormRow(const float* row, const float* w, int64_t n, float eps, bool simd, float* o) {
  if (simd && cpu::rms_norm_row_avx512(row, w, n, eps, o)) return;
  const float scale = cpu::rms_scale(cpu::sum_of_squares_portable(row, n), n, eps);
  for (int64_t j = 0; j < n; ++j) o[j] = w[j] * (row[j] * scale);
}

void CheckCpuFloat(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cpu(), name, ": expected a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, ": expected float32, got ", t.scalar_type());
}

}  // namespace

void rms_norm_row_bf16(const float* x, const float* w, int64_t n, float eps, float* scratch,
                       uint16_t* out) {
  if (has_avx512_bf16() && cpu::rms_norm_row_avx512bf16(x, w, n, eps, out)) return;
  RmsNormRow(x, w, n, eps, cpu_isa() >= CpuIsa::kAvx512, scratch);
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_bits_as_vcvtneps2bf16(scratch[j]);
}

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out) {
  RmsNormRow(x, w, n, eps, cpu_isa() >= CpuIsa::kAvx512, out);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                    at::ScalarType out_dtype) {
  CheckCpuFloat(x, "x");
  CheckCpuFloat(weight, "weight");
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16,
              "rms_norm: out_dtype must be float32 or bfloat16, got ", out_dtype);
  check_shape(x, "x", {-1, -1});
  const int64_t m = x.size(0), n = x.size(1);
  check_shape(weight, "weight", {n});
  TORCH_CHECK(n > 0, "x: rows must not be empty");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty({m, n}, xc.options().dtype(out_dtype));
  const bool bf16 = out_dtype == at::kBFloat16;
  const float* src = xc.const_data_ptr<float>();
  const float* w = wc.const_data_ptr<float>();
  float* dst = bf16 ? nullptr : out.data_ptr<float>();
  auto* dst_bf16 = bf16 ? static_cast<uint16_t*>(out.data_ptr()) : nullptr;
  const bool simd = cpu_isa() >= CpuIsa::kAvx512;
  const float eps_f = static_cast<float>(eps);
  cpu::parallel_for(0, m, RowGrain(n), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(bf16 ? static_cast<size_t>(n) : 0);
    for (int64_t r = begin; r < end; ++r) {
      const float* row = src + r * n;
      if (bf16) {
        rms_norm_row_bf16(row, w, n, eps_f, scratch.data(), dst_bf16 + r * n);
      } else {
        RmsNormRow(row, w, n, eps_f, simd, dst + r * n);
      }
    }
  });
  return out;
}

void rope_rotate_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  CheckCpuFloat(x, "x");
  CheckCpuFloat(cos, "cos");
  CheckCpuFloat(sin, "sin");
  check_shape(x, "x", {-1, -1, -1});
  const int64_t m = x.size(0), heads = x.size(1), d = x.size(2);
  check_shape(cos, "cos", {m, d});
  check_shape(sin, "sin", {m, d});
  TORCH_CHECK(d % 2 == 0, "x: head size must be even, got ", d);
  TORCH_CHECK(x.stride(2) == 1, "x: the last dimension must be contiguous");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos/sin: expected contiguous tensors");
  const int64_t half = d / 2, row_stride = x.stride(0), head_stride = x.stride(1);
  float* base = x.data_ptr<float>();
  const float* c = cos.const_data_ptr<float>();
  const float* s = sin.const_data_ptr<float>();
  const bool simd = cpu_isa() >= CpuIsa::kAvx512;
  cpu::parallel_for(0, m, RowGrain(heads * d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* cr = c + r * d;
      const float* sr = s + r * d;
      if (simd &&
          cpu::rope_rotate_row_avx512(base + r * row_stride, heads, head_stride, d, cr, sr)) {
        continue;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = base + r * row_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const float lo = v[i], hi = v[i + half];
          // rotate_half(x) = (-x[half:], x[:half]); each product rounds, then the sum.
          v[i] = lo * cr[i] + (-hi) * sr[i];
          v[i + half] = hi * cr[i + half] + lo * sr[i + half];
        }
      }
    }
  });
}

namespace {

// One row of silu_mul from float32 or bfloat16 gate and up into a float32
// or bfloat16 (rowwise.h) row o; `row` holds the float32 results of a
// bfloat16 row off AVX-512.
template <typename T, typename Out>
void SiluMulRow(const T* gate, const T* up, int64_t n, CpuIsa isa, bool avx512_bf16,
                std::vector<float>& row, Out* o) {
  if (avx512_bf16 && cpu::silu_mul_row_avx512bf16(gate, up, n, o)) return;
  float* f = nullptr;
  if constexpr (std::is_same_v<Out, uint16_t>) {
    row.resize(static_cast<size_t>(n));
    f = row.data();
  } else {
    f = o;
  }
  if (isa == CpuIsa::kPortable || !cpu::silu_mul_row_avx2(gate, up, n, f)) {
    for (int64_t i = 0; i < n; ++i) f[i] = cpu::silu_mul_scalar(gate[i], up[i]);
  }
  if constexpr (std::is_same_v<Out, uint16_t>) {
    for (int64_t i = 0; i < n; ++i) o[i] = bf16_bits_as_vcvtneps2bf16(f[i]);
  }
}

// silu_mul's rows from float32 or bfloat16 gate_up [m, 2 * inter] into
// float32 or bfloat16 (rowwise.h) rows.
template <typename T, typename Out>
void SiluMulRows(const T* src, int64_t m, int64_t inter, Out* dst) {
  const CpuIsa isa = cpu_isa();
  const bool avx512_bf16 = has_avx512_bf16();
  cpu::parallel_for(0, m, RowGrain(inter), [&](int64_t begin, int64_t end) {
    std::vector<float> row;
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = src + r * 2 * inter;
      SiluMulRow(gate, gate + inter, inter, isa, avx512_bf16, row, dst + r * inter);
    }
  });
}

template <typename T>
void SiluMulInto(const T* src, int64_t m, int64_t inter, at::Tensor& out) {
  if (out.scalar_type() == at::kBFloat16) {
    SiluMulRows(src, m, inter, static_cast<uint16_t*>(out.data_ptr()));
  } else {
    SiluMulRows(src, m, inter, out.data_ptr<float>());
  }
}

}  // namespace

void silu_mul_row(const float* gate, const float* up, int64_t n, float* out) {
  std::vector<float> unused;  // float32 rows need no staging
  SiluMulRow(gate, up, n, cpu_isa(), has_avx512_bf16(), unused, out);
}

at::Tensor silu_mul(const at::Tensor& gate_up, at::ScalarType out_dtype) {
  TORCH_CHECK(gate_up.is_cpu(), "gate_up: expected a CPU tensor");
  const bool bf16 = gate_up.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || gate_up.scalar_type() == at::kFloat,
              "gate_up: expected float32 or bfloat16, got ", gate_up.scalar_type());
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16,
              "silu_mul: out_dtype must be float32 or bfloat16, got ", out_dtype);
  check_shape(gate_up, "gate_up", {-1, -1});
  TORCH_CHECK(gate_up.is_contiguous(), "gate_up: expected a contiguous tensor");
  const int64_t m = gate_up.size(0), inter = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up: expected an even column count");
  at::Tensor out = at::empty({m, inter}, gate_up.options().dtype(out_dtype));
  if (bf16) {
    SiluMulInto(static_cast<const uint16_t*>(gate_up.const_data_ptr()), m, inter, out);
  } else {
    SiluMulInto(gate_up.const_data_ptr<float>(), m, inter, out);
  }
  return out;
}

}  // namespace snapserve::kernels
