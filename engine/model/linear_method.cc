#include "engine/model/linear_method.h"

#include "engine/model/weights.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/prefill_gemm/prefill_gemm_amx.h"
#include "kernels/quant/quant_matrix.h"

namespace snapserve::model {

namespace {

// `w` decoded and rounded to bfloat16, a row group at a time (a group's
// float32 copy is the only transient).
at::Tensor BFloat16Copy(const LinearWeight& w) {
  if (!w.quantized()) return w.dense.to(at::kBFloat16);
  std::vector<at::Tensor> groups;
  for (const kernels::QuantMatrix& part : w.parts) {
    groups.push_back(kernels::dequantize(part).to(at::kBFloat16));
  }
  return at::cat(groups, 0);
}

// Whether every part of `w` has int8 panels (kernels/prefill_gemm/prefill_gemm_int8.h)
// and this CPU runs them fast: without VNNI only their portable twin would,
// and the AVX2 row kernel of quant_dot.h is faster there.
bool HasInt8Panels(const LinearWeight& w) {
  if (!w.quantized() || kernels::cpu_isa() < kernels::CpuIsa::kAvx512Vnni) return false;
  for (const kernels::QuantMatrix& part : w.parts) {
    if (!kernels::has_int8_panels(part.type)) return false;
  }
  return true;
}

// Decode's panels of one part: nibbles where the type has them (decode reads
// every weight each step), else bytes.
kernels::Int8Panels DecodePanels(const kernels::QuantMatrix& part) {
  return kernels::pack_int8_panels(part, kernels::has_nibble_panels(part.type));
}

// The kernel of the weights as loaded, where nothing was repacked: GGUF
// blocks (CPU only) decoded row by row inside the kernel; on CPU, float32 or
// bfloat16 weights by the fixed-order kernel at decode-sized batches
// (kernels/linear/linear.h); elsewhere LibTorch's.
LinearKernel UnpackedKernel(const LinearWeight& w, bool cpu) {
  if (w.quantized()) return LinearKernel::kGgufBlocks;
  const at::ScalarType type = w.dense.scalar_type();
  if (cpu && (type == at::kFloat || type == at::kBFloat16)) return LinearKernel::kDenseCpu;
  return LinearKernel::kAtLinear;
}

// `linear(part)` for each part of a fused matrix, columns side by side.
template <typename Part, typename Fn>
at::Tensor PartColumns(const std::vector<Part>& parts, const Fn& linear) {
  if (parts.size() == 1) return linear(parts[0]);
  std::vector<at::Tensor> columns;
  columns.reserve(parts.size());
  for (const Part& part : parts) columns.push_back(linear(part));
  return at::cat(columns, 1);
}

}  // namespace

LinearMethod PrepareLinearMethod(const LinearWeight& w, const LinearPrecision& precision,
                                 at::Device device, LinearUse use) {
  LinearMethod m;
  m.precision = precision;
  const bool cpu = device.is_cpu();
  const bool layer = use == LinearUse::kLayer;
  const bool int8_decode = precision.dot == kernels::QuantDot::kInt8;
  const bool panels = cpu && HasInt8Panels(w);
  const bool prompt_panels = layer && panels && precision.prefill == kernels::PrefillGemm::kInt8;
  for (const kernels::QuantMatrix& part : w.parts) {
    if (prompt_panels) {
      m.prompt_panels.push_back(kernels::pack_int8_panels(part));
      m.repacked_bytes += m.prompt_panels.back().nbytes();
    }
    if (!panels || !int8_decode) continue;
    if (prompt_panels && !kernels::has_nibble_panels(part.type)) {
      // Decode would pack the same bytes: share the prompt's tensors.
      m.decode_panels.push_back(m.prompt_panels.back());
    } else {
      m.decode_panels.push_back(DecodePanels(part));
      m.repacked_bytes += m.decode_panels.back().nbytes();
    }
  }
  // Prompts take the panels under kInt8, else a bfloat16 copy under
  // kBFloat16 or kInt8.
  const bool copy =
      layer && cpu && precision.prefill != kernels::PrefillGemm::kFloat32 && !prompt_panels;
  if (copy) {
    at::Tensor bf16 = BFloat16Copy(w);
    if (kernels::amx_gemm_fits(w.rows(), w.cols())) {
      // On AMX the tiles' layout replaces the row-major copy.
      m.amx_tiles = kernels::pack_amx_weight(bf16);
      m.repacked_bytes += static_cast<int64_t>(m.amx_tiles.nbytes());
    } else {
      m.bf16_copy = std::move(bf16);
      // A bfloat16 dense weight is its own "copy": no extra bytes.
      if (!m.bf16_copy.is_same(w.dense)) {
        m.repacked_bytes += static_cast<int64_t>(m.bf16_copy.nbytes());
      }
    }
  }
  const LinearKernel unpacked = UnpackedKernel(w, cpu);
  m.prompt = !m.prompt_panels.empty() ? LinearKernel::kInt8Panels
             : m.amx_tiles.defined()  ? LinearKernel::kAmxTiles
             : m.bf16_copy.defined()  ? LinearKernel::kBFloat16Copy
                                      : unpacked;
  m.decode = !m.decode_panels.empty() ? LinearKernel::kInt8Panels : unpacked;
  return m;
}

void PrepareLinearMethods(LlamaWeights& weights, const LinearPrecision& precision,
                          at::Device device) {
  weights.lm_head.method =
      PrepareLinearMethod(weights.lm_head, precision, device, LinearUse::kLmHead);
  for (LayerWeights& l : weights.layers) {
    for (LinearWeight* w : {&l.qkv, &l.o_proj, &l.gate_up, &l.down}) {
      w->method = PrepareLinearMethod(*w, precision, device, LinearUse::kLayer);
    }
  }
}

at::Tensor ApplyLinear(const LinearWeight& w, const at::Tensor& x) {
  const LinearMethod& m = w.method;
  const int64_t rows = x.size(0);
  switch (m.kernel_for(rows)) {
    case LinearKernel::kInt8Panels:
      // A row's bits do not depend on how many rows come with it
      // (kernels/prefill_gemm/prefill_gemm_int8.h), so batching invariance
      // holds on them.
      return PartColumns(m.panels_for(rows), [&](const kernels::Int8Panels& p) {
        return kernels::linear_int8_panels(x, p);
      });
    case LinearKernel::kAmxTiles:
      return kernels::linear_amx(x, m.amx_tiles, kernels::AmxOut::kFloat32);
    case LinearKernel::kBFloat16Copy:
      return kernels::linear_float32(x, m.bf16_copy, m.precision.float_prefill());
    case LinearKernel::kGgufBlocks:
      // A matrix of several block types is computed a row group at a time.
      return PartColumns(w.parts, [&](const kernels::QuantMatrix& part) {
        return kernels::linear_quantized(x, part, m.precision.dot, m.precision.float_prefill());
      });
    case LinearKernel::kDenseCpu:
      // Activations of another dtype fall through to LibTorch's linear.
      if (x.is_cpu() && x.scalar_type() == at::kFloat) {
        return kernels::linear_float32(x, w.dense, m.precision.float_prefill(), m.precision.decode);
      }
      break;
    case LinearKernel::kAtLinear:
      break;
    case LinearKernel::kUnprepared:
      TORCH_CHECK(false, "ApplyLinear: no method was prepared for this matrix");
  }
  return at::linear(x, w.dense);
}

at::Tensor ApplyLinearWidenedLater(const LinearWeight& w, const at::Tensor& x) {
  const LinearMethod& m = w.method;
  // Only prompt-sized products have bfloat16 GEMMs.
  switch (m.kernel_for(x.size(0))) {
    case LinearKernel::kAmxTiles:
      return kernels::linear_amx(x, m.amx_tiles, kernels::AmxOut::kBFloat16);
    case LinearKernel::kBFloat16Copy:
      if (m.precision.float_prefill() == kernels::PrefillGemm::kBFloat16) {
        return kernels::linear_bf16_gemm(x, m.bf16_copy);
      }
      break;
    default:
      break;
  }
  return ApplyLinear(w, x);
}

void AddLinear(at::Tensor& h, const LinearWeight& w, const at::Tensor& x) {
  const LinearMethod& m = w.method;
  const int64_t rows = x.size(0);
  const bool into_h = h.is_contiguous() && h.scalar_type() == at::kFloat;
  if (const kernels::Int8Panels* panels = m.single_panels(rows); panels != nullptr && into_h) {
    kernels::linear_int8_panels_add_(h, x, *panels);
    return;
  }
  if (m.kernel_for(rows) == LinearKernel::kAmxTiles && into_h) {
    kernels::linear_amx_add_(h, x.contiguous(), m.amx_tiles);
    return;
  }
  h.add_(ApplyLinear(w, x));
}

}  // namespace snapserve::model
