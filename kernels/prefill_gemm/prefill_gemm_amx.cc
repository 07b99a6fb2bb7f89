// Checks, weight packing and the split between pool threads for
// kernels/prefill_gemm/prefill_gemm_amx.h; the tile loop is prefill_gemm_cpu_amx_nocontract.cc.
#include "kernels/prefill_gemm/prefill_gemm_amx.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <span>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/rowwise/rowwise.h"

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

// Rows [row0, row1) of x, through `norm` if it has a weight, into xb as
// pack_amx_rows lays them out.
void pack_rows(const at::Tensor& x, const AmxRowNorm& norm, uint16_t* xb, int64_t row0,
               int64_t row1) {
  const int64_t m = x.size(0), k = x.size(1);
  if (norm.weight != nullptr) {
    // Each row normalized into a row buffer (it stays in L1) and copied to
    // its tile rows; the padding rows past m are zero, as pack_amx_rows
    // leaves them.
    std::vector<float> scratch(k);
    std::vector<uint16_t> row(k);
    const float* src = x.const_data_ptr<float>();
    const float* w = norm.weight->const_data_ptr<float>();
    const auto eps = static_cast<float>(norm.eps);
    const int64_t real_end = std::min(row1, m);
    for (int64_t r = row0; r < real_end; ++r) {
      rms_norm_row_bf16(src + r * k, w, k, eps, scratch.data(), row.data());
      cpu::pack_amx_row(row.data(), k, r, xb);
    }
    if (row1 > real_end) {
      cpu::pack_amx_rows(nullptr, nullptr, m, k, std::max(row0, real_end), row1, xb);
    }
    return;
  }
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  cpu::pack_amx_rows(bf16 ? nullptr : x.const_data_ptr<float>(),
                     bf16 ? static_cast<const uint16_t*>(x.const_data_ptr()) : nullptr, m, k, row0,
                     row1, xb);
}

// Products over m rows, in order: the first reads x's tiles xb, a later one
// the packed output of the one before (the MLP's down reads what the SwiGLU
// epilogue wrote). Rows are split between the pool's threads in 32-row
// blocks, each thread packing its own rows first (pack(row0, row1) fills
// them in xb; a no-op for rows that came packed) and then running every
// product on them (one parallel region, the rows still in cache; a thread's
// down rows are the SwiGLU rows it wrote). With fewer row blocks than
// threads the columns are split instead, after one shared packing pass, a
// parallel region per product.
template <typename Pack>
void run_on_tiles(int64_t m, const uint16_t* xb, const Pack& pack,
                  std::span<cpu::AmxGemmArgs> products) {
  TORCH_CHECK(has_amx_bf16(), "linear_amx: this CPU (or SNAPSERVE_CPU_ISA) has no AMX-BF16");
  if (m == 0) return;
  const int64_t row_blocks = round_up(m, kBlock) / kBlock;
  products.front().x = xb;
  for (cpu::AmxGemmArgs& p : products) p.m = m;
  if (row_blocks >= at::get_num_threads()) {
    at::parallel_for(0, row_blocks, 1, [&](int64_t begin, int64_t end) {
      pack(begin * kBlock, end * kBlock);
      for (const cpu::AmxGemmArgs& p : products) {
        cpu::gemm_amx_blocks(p, begin, end, 0, p.n / kBlock);
      }
    });
    return;
  }
  pack(0, row_blocks * kBlock);
  for (const cpu::AmxGemmArgs& p : products) {
    at::parallel_for(0, p.n / kBlock, 1, [&](int64_t begin, int64_t end) {
      cpu::gemm_amx_blocks(p, 0, row_blocks, begin, end);
    });
  }
}

// run_on_tiles for x [m, k], packed (through norm) into tiles of its own.
void run(const at::Tensor& x, const AmxRowNorm& norm, std::span<cpu::AmxGemmArgs> products) {
  TORCH_CHECK(x.is_cpu() && x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "linear_amx: x must be a contiguous 2-D float32 or bfloat16 CPU tensor");
  if (norm.weight != nullptr) {
    const at::Tensor& w = *norm.weight;
    TORCH_CHECK(x.scalar_type() == at::kFloat, "linear_amx: a normed x must be float32");
    TORCH_CHECK(w.is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 1 && w.is_contiguous() &&
                    w.size(0) == x.size(1),
                "linear_amx: the norm's weight must be a contiguous float32 [", x.size(1),
                "] CPU tensor");
  }
  const int64_t m = x.size(0);
  at::Tensor xb = at::empty({round_up(m, kBlock), x.size(1)}, x.options().dtype(at::kBFloat16));
  auto* xb_bits = static_cast<uint16_t*>(xb.data_ptr());
  run_on_tiles(
      m, xb_bits, [&](int64_t row0, int64_t row1) { pack_rows(x, norm, xb_bits, row0, row1); },
      products);
}

// One product of x [m, k] and packed, to out with `epilogue`.
void run_one(const at::Tensor& x, const at::Tensor& packed, void* out, cpu::AmxEpilogue epilogue,
             const AmxRowNorm& norm = {}) {
  check_packed(packed, x.size(-1));
  cpu::AmxGemmArgs a;
  a.w = static_cast<const uint16_t*>(packed.const_data_ptr());
  a.n = packed.size(0) * 16;
  a.k = x.size(-1);
  a.out = out;
  a.epilogue = epilogue;
  run(x, norm, std::span(&a, 1));
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

at::Tensor linear_amx(const at::Tensor& x, const at::Tensor& packed, AmxOut out,
                      const AmxRowNorm& norm) {
  const bool bf16 = out == AmxOut::kBFloat16;
  at::Tensor y = at::empty({x.size(0), packed.size(0) * 16},
                           x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  run_one(x, packed, y.data_ptr(),
          bf16 ? cpu::AmxEpilogue::kStoreBFloat16 : cpu::AmxEpilogue::kStoreFloat32, norm);
  return y;
}

void linear_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(h.is_cpu() && h.scalar_type() == at::kFloat && h.is_contiguous() && h.dim() == 2 &&
                  h.size(0) == x.size(0) && h.size(1) == packed.size(0) * 16,
              "linear_amx_add_: h must be a contiguous float32 [m, n] CPU tensor");
  run_one(x, packed, h.data_ptr(), cpu::AmxEpilogue::kAddFloat32);
}

AmxPackedRows empty_amx_packed_rows(int64_t m, int64_t k) {
  TORCH_CHECK(m >= 0 && k > 0 && k % 32 == 0, "empty_amx_packed_rows: ", m, " rows of ", k,
              " (a multiple of 32) expected");
  AmxPackedRows x;
  x.m = m;
  x.k = k;
  x.tiles = at::empty({round_up(m, kBlock) * k}, at::TensorOptions().dtype(at::kBFloat16));
  cpu::pack_amx_rows(nullptr, nullptr, m, k, m, round_up(m, kBlock),
                     static_cast<uint16_t*>(x.tiles.data_ptr()));  // the padding rows: zero
  return x;
}

void linear_amx_add_(at::Tensor& h, const AmxPackedRows& x, const at::Tensor& packed) {
  TORCH_CHECK(x.tiles.defined() && x.tiles.is_cpu() && x.tiles.scalar_type() == at::kBFloat16 &&
                  x.tiles.is_contiguous() && x.tiles.numel() == round_up(x.m, kBlock) * x.k,
              "linear_amx_add_: x is not an AmxPackedRows of ", x.m, " rows of ", x.k);
  TORCH_CHECK(h.is_cpu() && h.scalar_type() == at::kFloat && h.is_contiguous() && h.dim() == 2 &&
                  h.size(0) == x.m && h.size(1) == packed.size(0) * 16,
              "linear_amx_add_: h must be a contiguous float32 [m, n] CPU tensor");
  check_packed(packed, x.k);
  cpu::AmxGemmArgs a;
  a.w = static_cast<const uint16_t*>(packed.const_data_ptr());
  a.n = packed.size(0) * 16;
  a.k = x.k;
  a.out = h.data_ptr();
  a.epilogue = cpu::AmxEpilogue::kAddFloat32;
  run_on_tiles(
      x.m, static_cast<const uint16_t*>(x.tiles.const_data_ptr()), [](int64_t, int64_t) {},
      std::span(&a, 1));
}

bool amx_mlp_fits(int64_t inter, int64_t k) {
  return amx_gemm_fits(2 * inter, k) && amx_gemm_fits(k, inter) && inter % kBlock == 0;
}

void mlp_amx_add_(at::Tensor& h, const at::Tensor& x, const at::Tensor& gate_up,
                  const at::Tensor& down, const AmxRowNorm& norm) {
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
  run(x, norm, products);
}

}  // namespace snapserve::kernels
