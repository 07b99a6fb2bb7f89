// Checks, weight packing and the split between pool threads for
// kernels/prefill_gemm_amx.h; the tile loop is prefill_gemm_cpu_amx.cc.
#include "kernels/prefill_gemm_amx.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <span>

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

// Products over x, in order: the first reads x's packed tiles, a later one
// the packed output of the one before (the MLP's down reads what the SwiGLU
// epilogue wrote). Rows are split between the pool's threads in 32-row
// blocks, each thread packing its own rows first and then running every
// product on them (one parallel region, the rows still in cache; a thread's
// down rows are the SwiGLU rows it wrote). With fewer row blocks than
// threads the columns are split instead, after one shared packing pass, a
// parallel region per product.
void run(const at::Tensor& x, std::span<cpu::AmxGemmArgs> products) {
  TORCH_CHECK(x.is_cpu() && x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "linear_amx: x must be a contiguous 2-D float32 or bfloat16 CPU tensor");
  TORCH_CHECK(has_amx_bf16(), "linear_amx: this CPU (or SNAPSERVE_CPU_ISA) has no AMX-BF16");
  const int64_t m = x.size(0);
  if (m == 0) return;
  const int64_t row_blocks = round_up(m, kBlock) / kBlock;
  at::Tensor xb = at::empty({row_blocks * kBlock, x.size(1)}, x.options().dtype(at::kBFloat16));
  auto* xb_bits = static_cast<uint16_t*>(xb.data_ptr());
  products.front().x = xb_bits;
  for (cpu::AmxGemmArgs& p : products) p.m = m;
  if (row_blocks >= at::get_num_threads()) {
    at::parallel_for(0, row_blocks, 1, [&](int64_t begin, int64_t end) {
      pack_rows(x, xb_bits, begin * kBlock, end * kBlock);
      for (const cpu::AmxGemmArgs& p : products) {
        cpu::gemm_amx_blocks(p, begin, end, 0, p.n / kBlock);
      }
    });
    return;
  }
  pack_rows(x, xb_bits, 0, row_blocks * kBlock);
  for (const cpu::AmxGemmArgs& p : products) {
    at::parallel_for(0, p.n / kBlock, 1, [&](int64_t begin, int64_t end) {
      cpu::gemm_amx_blocks(p, 0, row_blocks, begin, end);
    });
  }
}

// One product of x [m, k] and packed, to out with `epilogue`.
void run_one(const at::Tensor& x, const at::Tensor& packed, void* out, cpu::AmxEpilogue epilogue) {
  check_packed(packed, x.size(-1));
  cpu::AmxGemmArgs a;
  a.w = static_cast<const uint16_t*>(packed.const_data_ptr());
  a.n = packed.size(0) * 16;
  a.k = x.size(-1);
  a.out = out;
  a.epilogue = epilogue;
  run(x, std::span(&a, 1));
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
  run_one(x, packed, y.data_ptr(),
          bf16 ? cpu::AmxEpilogue::kStoreBFloat16 : cpu::AmxEpilogue::kStoreFloat32);
  return y;
}

void linear_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(h.is_cpu() && h.scalar_type() == at::kFloat && h.is_contiguous() && h.dim() == 2 &&
                  h.size(0) == x.size(0) && h.size(1) == packed.size(0) * 16,
              "linear_amx_add_: h must be a contiguous float32 [m, n] CPU tensor");
  run_one(x, packed, h.data_ptr(), cpu::AmxEpilogue::kAddFloat32);
}

bool amx_mlp_fits(int64_t inter, int64_t k) {
  return amx_gemm_fits(2 * inter, k) && amx_gemm_fits(k, inter) && inter % kBlock == 0;
}

void mlp_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& gate_up,
                  const at::Tensor& down) {
  const int64_t k = x.size(-1);
  check_packed(gate_up, k);
  const int64_t inter = gate_up.size(0) * 16 / 2;
  check_packed(down, inter);
  TORCH_CHECK(inter % kBlock == 0 && down.size(0) * 16 == k,
              "mlp_amx_add_: expected gate_up [2 * inter, k] and down [k, inter], inter a "
              "multiple of 32; got inter ",
              inter, ", k ", k, ", down's n ", down.size(0) * 16);
  TORCH_CHECK(h.is_cpu() && h.scalar_type() == at::kFloat && h.is_contiguous() && h.dim() == 2 &&
                  h.size(0) == x.size(0) && h.size(1) == k,
              "mlp_amx_add_: h must be a contiguous float32 [m, k] CPU tensor");
  // down's x: the SwiGLU output, packed as its tiles (padding rows included).
  at::Tensor hidden =
      at::empty({round_up(x.size(0), kBlock), inter}, x.options().dtype(at::kBFloat16));
  cpu::AmxGemmArgs products[2];
  products[0].w = static_cast<const uint16_t*>(gate_up.const_data_ptr());
  products[0].n = 2 * inter;
  products[0].k = k;
  products[0].out = hidden.data_ptr();
  products[0].epilogue = cpu::AmxEpilogue::kSwiGluPacked;
  products[1].x = static_cast<const uint16_t*>(hidden.const_data_ptr());
  products[1].w = static_cast<const uint16_t*>(down.const_data_ptr());
  products[1].n = k;
  products[1].k = inter;
  products[1].out = h.data_ptr();
  products[1].epilogue = cpu::AmxEpilogue::kAddFloat32;
  run(x, products);
}

}  // namespace snapserve::kernels
