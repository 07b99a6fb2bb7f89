// Checks, weight packing and the split between pool threads for
// kernels/prefill_gemm_amx.h; the tile loop is prefill_gemm_cpu_amx.cc.
#include "kernels/prefill_gemm_amx.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "kernels/cpu_isa.h"

namespace snapserve::kernels {

namespace {

constexpr int64_t kBlock = kAmxGemmBlock;

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

void check_packed(const at::Tensor& packed, int64_t k) {
  TORCH_CHECK(packed.defined() && packed.is_cpu() && packed.scalar_type() == at::kBFloat16 &&
                  packed.dim() == 4 && packed.is_contiguous() && packed.size(2) == 16 &&
                  packed.size(3) == 32,
              "linear_amx: expected a weight from pack_amx_weight");
  TORCH_CHECK(packed.size(1) * 32 == k, "linear_amx: x has ", k, " columns, the weight ",
              packed.size(1) * 32);
}

// Rows [row0, row1) of x into xb as pack_amx_rows lays them out.
void pack_rows(const at::Tensor& x, uint16_t* xb, int64_t row0, int64_t row1) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  cpu::pack_amx_rows(bf16 ? nullptr : x.const_data_ptr<float>(),
                     bf16 ? static_cast<const uint16_t*>(x.const_data_ptr()) : nullptr, x.size(0),
                     x.size(1), row0, row1, xb);
}

// out (or h) from x · wᵀ with `epilogue`. Rows are split between the pool's
// threads in 32-row blocks, each thread packing its own rows first (one
// parallel region, the rows still in cache). With fewer row blocks than
// threads the columns are split instead, after one shared packing pass.
void run(const at::Tensor& x, const at::Tensor& packed, void* out, cpu::AmxEpilogue epilogue) {
  TORCH_CHECK(x.is_cpu() && x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "linear_amx: x must be a contiguous 2-D float32 or bfloat16 CPU tensor");
  check_packed(packed, x.size(1));
  TORCH_CHECK(has_amx_bf16(), "linear_amx: this CPU (or SNAPSERVE_CPU_ISA) has no AMX-BF16");
  cpu::AmxGemmArgs a;
  a.m = x.size(0);
  a.k = x.size(1);
  a.n = packed.size(0) * 16;
  a.w = static_cast<const uint16_t*>(packed.const_data_ptr());
  a.out = out;
  a.epilogue = epilogue;
  if (a.m == 0) return;
  const int64_t row_blocks = round_up(a.m, kBlock) / kBlock, col_blocks = a.n / kBlock;
  at::Tensor xb = at::empty({row_blocks * kBlock, a.k}, x.options().dtype(at::kBFloat16));
  auto* xb_bits = static_cast<uint16_t*>(xb.data_ptr());
  a.x = xb_bits;
  const int64_t threads = at::get_num_threads();
  if (row_blocks >= threads) {
    at::parallel_for(0, row_blocks, 1, [&](int64_t begin, int64_t end) {
      pack_rows(x, xb_bits, begin * kBlock, end * kBlock);
      cpu::gemm_amx_blocks(a, begin, end, 0, col_blocks);
    });
    return;
  }
  pack_rows(x, xb_bits, 0, row_blocks * kBlock);
  at::parallel_for(0, col_blocks, 1, [&](int64_t begin, int64_t end) {
    cpu::gemm_amx_blocks(a, 0, row_blocks, begin, end);
  });
}

}  // namespace

bool amx_gemm_fits(int64_t n, int64_t k) {
  return has_amx_bf16() && n > 0 && k > 0 && n % kBlock == 0 && k % 32 == 0;
}

at::Tensor pack_amx_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_cpu() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack_amx_weight: expected a 2-D float32 or bfloat16 CPU tensor");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n % kBlock == 0 && k % 32 == 0, "pack_amx_weight: [", n, ", ", k,
              "] is not a multiple of [32, 32]");
  // [n, k] -> [n/16, 16 cols, k/32, 16 pairs, 2] -> [n/16, k/32, 16 pairs, 16 cols, 2].
  return w.to(at::kBFloat16)
      .reshape({n / 16, 16, k / 32, 16, 2})
      .permute({0, 2, 3, 1, 4})
      .contiguous()
      .reshape({n / 16, k / 32, 16, 32});
}

at::Tensor linear_amx(const at::Tensor& x, const at::Tensor& packed, AmxOut out) {
  const bool bf16 = out == AmxOut::kBFloat16;
  at::Tensor y = at::empty({x.size(0), packed.size(0) * 16},
                           x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  run(x, packed, y.data_ptr(),
      bf16 ? cpu::AmxEpilogue::kStoreBFloat16 : cpu::AmxEpilogue::kStoreFloat32);
  return y;
}

void linear_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(h.is_cpu() && h.scalar_type() == at::kFloat && h.is_contiguous() && h.dim() == 2 &&
                  h.size(0) == x.size(0) && h.size(1) == packed.size(0) * 16,
              "linear_amx_add_: h must be a contiguous float32 [m, n] CPU tensor");
  run(x, packed, h.data_ptr(), cpu::AmxEpilogue::kAddFloat32);
}

}  // namespace snapserve::kernels
