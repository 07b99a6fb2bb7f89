// Packing, checks, dispatch and the portable kernel of the int8 prompt GEMM
// (kernels/prefill_gemm/prefill_gemm_int8.h); the VNNI kernel is in
// prefill_gemm_int8_cpu_avx512vnni_nocontract.cc.
#include "kernels/prefill_gemm/prefill_gemm_int8.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/parallel_dynamic.h"
#include "kernels/cpu/thread_scratch.h"
#include "kernels/linear/linear.h"
#include "kernels/quant_dot/quant_dot.h"
#include "kernels/quant_dot/quant_dot_cpu_block.h"
#include "kernels/rowwise/rowwise.h"

namespace snapserve::kernels {

namespace {

// Byte offset of weight row `row` (0..31 in its panel), block column `col`
// (0..31) within a panel's block: quad col / 4 (its pair col / 4 % 4 for
// nibbles), tile row / 16, lane row % 16.
int64_t panel_byte(int64_t row, int64_t col, bool nibbles) {
  const int64_t quad = nibbles ? col / 4 % 4 : col / 4;
  return (quad * 2 + row / 16) * 64 + (row % 16) * 4 + col % 4;
}

// The unsigned small integer of (row, col) in a panel's block.
int panel_value(const uint8_t* blk, int64_t row, int64_t col, bool nibbles) {
  const uint8_t byte = blk[panel_byte(row, col, nibbles)];
  if (!nibbles) return byte;
  return col / 16 == 0 ? byte & 0x0F : byte >> 4;  // quads 0-3 low, 4-7 high
}

// The bias that makes a signed type's small integers unsigned.
int type_bias(QuantType type) {
  switch (type) {
    case QuantType::kQ4_0:
      return 8;
    case QuantType::kQ5_0:
      return 16;
    case QuantType::kQ8_0:
      return 128;
    default:
      return 0;  // Q4_1, Q5_1: unsigned, with an offset m
  }
}

}  // namespace

bool has_int8_panels(QuantType type) { return has_int8_dot(type); }

bool has_nibble_panels(QuantType type) {
  return type == QuantType::kQ4_0 || type == QuantType::kQ4_1;
}

Int8Panels pack_int8_panels(const QuantMatrix& w, bool nibbles) {
  TORCH_CHECK(has_int8_panels(w.type), "int8 prompt GEMM: no panels for ",
              quant_format(w.type).name, " blocks");
  TORCH_CHECK(!nibbles || has_nibble_panels(w.type), "int8 panels: ", quant_format(w.type).name,
              " blocks have more than 4 bits");
  Int8Panels p;
  p.n = w.rows;
  p.k = w.cols;
  p.panels = (w.rows + kPanelRows - 1) / kPanelRows;
  p.blocks = w.cols / kPanelBlock;
  p.nibbles = nibbles;
  const int bias = type_bias(w.type);
  p.bias = static_cast<float>(bias);
  p.bytes = at::zeros({p.panels, p.blocks, p.block_bytes()}, at::kByte);
  p.scales = at::zeros({p.panels, p.blocks, 2, kPanelRows}, at::kHalf);
  uint8_t* bytes = p.bytes.data_ptr<uint8_t>();
  auto* scales = p.scales.data_ptr<at::Half>();
  const int64_t block_bytes = quant_format(w.type).block_bytes;
  cpu::parallel_for(0, p.panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel) {
      for (int64_t r = 0; r < kPanelRows && panel * kPanelRows + r < w.rows; ++r) {
        const uint8_t* row = w.row(panel * kPanelRows + r);
        for (int64_t b = 0; b < p.blocks; ++b) {
          // weight = d * v (+ m): v + bias is the unsigned byte.
          const cpu::WeightBlock wb = cpu::read_block(w.type, row + b * block_bytes);
          uint8_t* dst = bytes + (panel * p.blocks + b) * p.block_bytes();
          for (int64_t c = 0; c < kPanelBlock; ++c) {
            const auto u = static_cast<uint8_t>(wb.v[c] + bias);
            dst[panel_byte(r, c, nibbles)] |= nibbles && c >= 16 ? u << 4 : u;
          }
          // d and m came from float16 fields: exact as float16 again.
          at::Half* sc = scales + ((panel * p.blocks + b) * 2) * kPanelRows;
          sc[r] = at::Half(wb.d);
          sc[kPanelRows + r] = at::Half(wb.has_m ? wb.m : 0.0f);
        }
      }
    }
  });
  return p;
}

namespace cpu {

void int8_panels_portable(const PanelActivations& x, const Int8Panels& w, int64_t p_begin,
                          int64_t p_end, float* out, int64_t ldo, bool accumulate) {
  const uint8_t* bytes = w.bytes.const_data_ptr<uint8_t>();
  const auto* scales = w.scales.const_data_ptr<at::Half>();
  for (int64_t panel = p_begin; panel < p_end; ++panel) {
    const int64_t rows = std::min(kPanelRows, w.n - panel * kPanelRows);
    for (int64_t i = 0; i < x.m; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < w.blocks; ++b) {
          const uint8_t* blk = bytes + (panel * w.blocks + b) * w.block_bytes();
          const int8_t* xq = x.q + i * x.k + b * kPanelBlock;
          int32_t sum = 0;
          for (int64_t c = 0; c < kPanelBlock; ++c) {
            sum += panel_value(blk, r, c, w.nibbles) * xq[c];
          }
          const at::Half* sc = scales + ((panel * w.blocks + b) * 2) * kPanelRows;
          const float d = sc[r], offset = static_cast<float>(sc[kPanelRows + r]) + -w.bias * d;
          const int64_t xb = i * w.blocks + b;
          acc = std::fma(static_cast<float>(sum), d * x.d[xb], acc);
          acc = std::fma(offset, x.s[xb], acc);
        }
        float& o = out[i * ldo + panel * kPanelRows + r];
        o = accumulate ? o + acc : acc;
      }
    }
  }
}

}  // namespace cpu

namespace {

// Rows the quantization makes at a time under an Int8Input step: 8 rows of
// k floats (18 KiB at k = 576, 48 KiB at 1,536) stay in a core's L1 or L2
// between the step that writes them and the quantization that reads them,
// and 8 rows' blocks keep the AVX-512 quantization's 16-block trees full.
constexpr int64_t kStepRows = 8;

// The thread scratch slots (kernels/cpu/thread_scratch.h) of the quantized
// activations and of the step's rows, which are alive at once on the
// calling thread.
constexpr int kActivationSlot = 0;
constexpr int kStepRowsSlot = 1;

// Rows [begin, end) of `input`'s step on xc into rows (k floats each).
void step_rows(const at::Tensor& xc, const Int8Input& input, int64_t k, int64_t begin, int64_t end,
               float* rows) {
  const float* src = xc.const_data_ptr<float>();
  for (int64_t r = begin; r < end; ++r) {
    float* row = rows + (r - begin) * k;
    if (input.step == Int8Input::Step::kRmsNorm) {
      rms_norm_row(src + r * k, input.norm_weight->const_data_ptr<float>(), k,
                   static_cast<float>(input.eps), row);
    } else {
      const float* gate = src + r * 2 * k;
      silu_mul_row(gate, gate + k, k, row);
    }
  }
}

// Quantizes `blocks` consecutive 32-blocks of x (quant_dot.h).
void quantize_blocks(const float* x, int64_t blocks, bool simd, int8_t* q, float* d, float* s) {
  if (simd && cpu::quantize_blocks_avx512(x, blocks, q, d, s)) return;
  cpu::quantize_blocks_portable(x, blocks, q, d, s);
}

// out (rows [m, w.n] at row stride w.n) = or += (input's rows of xc) · wᵀ;
// xc contiguous.
void run_int8_panels(const at::Tensor& xc, const Int8Panels& w, CpuIsa isa, const Int8Input& input,
                     float* dst, bool accumulate) {
  const int64_t m = xc.size(0), blocks = w.blocks, k = w.k;
  if (m == 0 || w.n == 0) return;
  // Every element is written by the quantization below: no zeroing (a
  // serial memset of up to 3 MiB per call otherwise).
  // q, then d and s, in one scratch the calling thread keeps between calls
  // (kernels/cpu/thread_scratch.h): a batch-1 step runs ~120 of these products,
  // and a heap allocation and free each was serial work between them.
  const int64_t q_bytes = (m * k + 63) / 64 * 64;  // d starts on a cache line
  const cpu::ThreadScratch scratch(kActivationSlot,
                                   q_bytes + 2 * m * blocks * int64_t{sizeof(float)});
  int8_t* q = reinterpret_cast<int8_t*>(scratch.get());
  float* d = reinterpret_cast<float*>(scratch.get() + q_bytes);
  float* s = d + m * blocks;
  const bool simd = isa >= CpuIsa::kAvx512Vnni;
  cpu::parallel_for(0, m, 64, [&](int64_t begin, int64_t end) {
    if (input.step == Int8Input::Step::kNone) {
      quantize_blocks(xc.const_data_ptr<float>() + begin * k, (end - begin) * blocks, simd,
                      q + begin * k, d + begin * blocks, s + begin * blocks);
      return;
    }
    const cpu::ThreadScratch scratch_rows(
        kStepRowsSlot, std::min(kStepRows, end - begin) * k * int64_t{sizeof(float)});
    auto* rows = reinterpret_cast<float*>(scratch_rows.get());
    for (int64_t r = begin; r < end; r += kStepRows) {
      const int64_t n = std::min(kStepRows, end - r);
      step_rows(xc, input, k, r, r + n, rows);
      quantize_blocks(rows, n * blocks, simd, q + r * k, d + r * blocks, s + r * blocks);
    }
  });
  const cpu::PanelActivations xa{q, d, s, m, w.k};
  auto run = [&](int64_t begin, int64_t end) {
    if (simd && cpu::int8_panels_avx512vnni(xa, w, begin, end, dst, w.n, accumulate)) return;
    cpu::int8_panels_portable(xa, w, begin, end, dst, w.n, accumulate);
  };
  // Prompts (compute-bound) hand panels out at run time
  // (kernels/cpu/parallel_dynamic.h); decode-sized batches read the weights
  // once and keep one contiguous share per thread, which streams better
  // (a batch-1 step was ~15 % slower with interleaved panels), a panel at a
  // time, the first thread done taking panels from the other's far end
  // (parallel_shares). A panel's columns are computed the same way whichever
  // thread takes it.
  if (m > kLinearSmallRows) {
    cpu::parallel_dynamic(w.panels, cpu::chunk_for(w.panels), run);
  } else {
    cpu::parallel_shares(w.panels, 1, run);
  }
}

void check_activations(const at::Tensor& x, const Int8Panels& w, const Int8Input& input) {
  const bool gate_up = input.step == Int8Input::Step::kSiluMul;
  check_shape(x, gate_up ? "gate_up" : "x", {-1, gate_up ? 2 * w.k : w.k});
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_cpu(), "x: expected float32 on CPU");
  if (input.step == Int8Input::Step::kRmsNorm) {
    TORCH_CHECK(input.norm_weight != nullptr, "int8 panels: the RMSNorm step needs its weight");
    check_shape(*input.norm_weight, "norm_weight", {w.k});
    TORCH_CHECK(input.norm_weight->scalar_type() == at::kFloat && input.norm_weight->is_cpu() &&
                    input.norm_weight->is_contiguous(),
                "norm_weight: expected a contiguous float32 CPU tensor");
  }
}

void check_output(const at::Tensor& out, const at::Tensor& x, const Int8Panels& w) {
  check_shape(out, "out", {x.size(0), w.n});
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_cpu() && out.is_contiguous(),
              "out: expected a contiguous float32 CPU tensor");
}

}  // namespace

at::Tensor linear_int8_panels(const at::Tensor& x, const Int8Panels& w, CpuIsa isa,
                              const Int8Input& input) {
  check_activations(x, w, input);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({xc.size(0), w.n}, xc.options());
  run_int8_panels(xc, w, isa, input, out.data_ptr<float>(), /*accumulate=*/false);
  return out;
}

void linear_int8_panels_out(at::Tensor& out, const at::Tensor& x, const Int8Panels& w, CpuIsa isa,
                            const Int8Input& input) {
  check_activations(x, w, input);
  check_output(out, x, w);
  run_int8_panels(x.contiguous(), w, isa, input, out.data_ptr<float>(), /*accumulate=*/false);
}

void linear_int8_panels_add_(at::Tensor& out, const at::Tensor& x, const Int8Panels& w, CpuIsa isa,
                             const Int8Input& input) {
  check_activations(x, w, input);
  check_output(out, x, w);
  run_int8_panels(x.contiguous(), w, isa, input, out.data_ptr<float>(), /*accumulate=*/true);
}

}  // namespace snapserve::kernels
