// Torch ops for the CPU linear layer (kernels/linear/linear.h) and the GGUF block
// decoders (kernels/quant/quant_blocks.h), so benchmarks and tests can drive them
// from Python against gguf-py and float64 references.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "kernels/linear/linear.h"
#include "kernels/prefill_gemm/prefill_gemm_amx.h"
#include "kernels/prefill_gemm/prefill_gemm_int8.h"
#include "kernels/quant/quant_matrix.h"
#include "kernels/rowwise/rowwise.h"

namespace snapserve::kernels {
namespace {

QuantType TypeOf(int64_t ggml_type) {
  const auto t = quant_type_from_ggml(static_cast<uint32_t>(ggml_type));
  TORCH_CHECK(t.has_value(), "ggml type ", ggml_type, " is not a supported block format");
  return *t;
}

// blocks: uint8 [rows, row_bytes] of `ggml_type` -> float32 [rows, cols].
at::Tensor GgufDequantize(const at::Tensor& blocks, int64_t ggml_type, int64_t cols) {
  return dequantize(
      make_quant_matrix(TypeOf(ggml_type), blocks.size(0), cols, blocks.contiguous(), "blocks"));
}

// dot: "exact" or "int8" (kernels/linear/linear.h, QuantDot).
at::Tensor LinearFloat32(const at::Tensor& x, const at::Tensor& w) { return linear_float32(x, w); }

at::Tensor LinearQuantized(const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_type,
                           int64_t cols, const std::string& dot) {
  TORCH_CHECK(dot == "exact" || dot == "int8", "dot: expected exact or int8, got ", dot);
  return linear_quantized(
      x, make_quant_matrix(TypeOf(ggml_type), blocks.size(0), cols, blocks.contiguous(), "blocks"),
      dot == "int8" ? QuantDot::kInt8 : QuantDot::kExact);
}

// The int8 prompt GEMM (kernels/prefill_gemm/prefill_gemm_int8.h) on `blocks`, packed
// per call (as nibbles when `nibbles`); isa: "portable" or "widest" (the VNNI
// kernel where the CPU has it).
Int8Panels PanelsOf(const at::Tensor& blocks, int64_t ggml_type, int64_t cols, bool nibbles) {
  return pack_int8_panels(
      make_quant_matrix(TypeOf(ggml_type), blocks.size(0), cols, blocks.contiguous(), "blocks"),
      nibbles);
}

CpuIsa IsaOf(const std::string& isa) {
  TORCH_CHECK(isa == "portable" || isa == "widest", "isa: expected portable or widest, got ", isa);
  return isa == "portable" ? CpuIsa::kPortable : cpu_isa();
}

at::Tensor LinearInt8Panels(const at::Tensor& x, const at::Tensor& blocks, int64_t ggml_type,
                            int64_t cols, const std::string& isa, bool nibbles) {
  return linear_int8_panels(x, PanelsOf(blocks, ggml_type, cols, nibbles), IsaOf(isa));
}

// out += x · wᵀ in place (linear_int8_panels_add_); returns out.
at::Tensor LinearInt8PanelsAdd(at::Tensor out, const at::Tensor& x, const at::Tensor& blocks,
                               int64_t ggml_type, int64_t cols, const std::string& isa,
                               bool nibbles) {
  linear_int8_panels_add_(out, x, PanelsOf(blocks, ggml_type, cols, nibbles), IsaOf(isa));
  return out;
}

// The normed int8 GEMM (below) written into out (linear_int8_panels_out,
// as a decode step's qkv buffer); returns out.
at::Tensor LinearInt8PanelsNormedOut(at::Tensor out, const at::Tensor& x,
                                     const at::Tensor& norm_weight, double eps,
                                     const at::Tensor& blocks, int64_t ggml_type, int64_t cols,
                                     const std::string& isa, bool nibbles) {
  linear_int8_panels_out(out, x, PanelsOf(blocks, ggml_type, cols, nibbles), IsaOf(isa),
                         Int8Input::rms_norm(norm_weight, eps));
  return out;
}

// The int8 GEMM with the row-wise step before it taken in its quantization
// (Int8Input): the product of RMSNorm(x) · norm_weight, and out += the
// product of silu_mul(gate_up) in place (returns out).
at::Tensor LinearInt8PanelsNormed(const at::Tensor& x, const at::Tensor& norm_weight, double eps,
                                  const at::Tensor& blocks, int64_t ggml_type, int64_t cols,
                                  const std::string& isa, bool nibbles) {
  return linear_int8_panels(x, PanelsOf(blocks, ggml_type, cols, nibbles), IsaOf(isa),
                            Int8Input::rms_norm(norm_weight, eps));
}
at::Tensor LinearInt8PanelsSiluAdd(at::Tensor out, const at::Tensor& gate_up,
                                   const at::Tensor& blocks, int64_t ggml_type, int64_t cols,
                                   const std::string& isa, bool nibbles) {
  linear_int8_panels_add_(out, gate_up, PanelsOf(blocks, ggml_type, cols, nibbles), IsaOf(isa),
                          Int8Input::silu_mul());
  return out;
}

// The AMX prompt GEMM (kernels/prefill_gemm/prefill_gemm_amx.h) on w packed per call;
// w [n, k] is packed per call (or comes packed: 4-D); out: "float32",
// "bfloat16" or "add" (h += x · wᵀ, returns h).
at::Tensor LinearAmx(at::Tensor h, const at::Tensor& x, const at::Tensor& w,
                     const std::string& out) {
  TORCH_CHECK(out == "float32" || out == "bfloat16" || out == "add",
              "out: expected float32, bfloat16 or add, got ", out);
  const at::Tensor packed = w.dim() == 4 ? w : pack_amx_weight(w);  // packed already
  if (out == "add") {
    linear_amx_add_(h, x, packed);
    return h;
  }
  return linear_amx(x, packed, out == "float32" ? AmxOut::kFloat32 : AmxOut::kBFloat16);
}

// The AMX MLP in one pass (kernels/prefill_gemm/prefill_gemm_amx.h) on packed weights:
// h += silu(gate) * up · downᵀ; returns h.
at::Tensor MlpAmxAdd(at::Tensor h, const at::Tensor& x, const at::Tensor& gate_up,
                     const at::Tensor& down) {
  mlp_amx_add_(h, x, gate_up, down);
  return h;
}

// The two products above with RMSNorm(h) · norm_weight taken in their
// packing (AmxRowNorm): qkv's float32 product of the normed h, and the MLP
// added into h in place.
at::Tensor LinearAmxNormed(const at::Tensor& h, const at::Tensor& norm_weight, double eps,
                           const at::Tensor& packed) {
  return linear_amx(h, packed, AmxOut::kFloat32, {&norm_weight, eps});
}
at::Tensor MlpAmxNormedAdd(at::Tensor h, const at::Tensor& norm_weight, double eps,
                           const at::Tensor& gate_up, const at::Tensor& down) {
  mlp_amx_add_(h, h, gate_up, down, {&norm_weight, eps});
  return h;
}

}  // namespace
}  // namespace snapserve::kernels

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("linear_float32(Tensor x, Tensor w) -> Tensor", &snapserve::kernels::LinearFloat32);
  m.def("gguf_dequantize(Tensor blocks, int ggml_type, int cols) -> Tensor",
        &snapserve::kernels::GgufDequantize);
  m.def("linear_quantized(Tensor x, Tensor blocks, int ggml_type, int cols, str dot) -> Tensor",
        &snapserve::kernels::LinearQuantized);
  m.def(
      "linear_int8_panels(Tensor x, Tensor blocks, int ggml_type, int cols, str isa, "
      "bool nibbles) -> Tensor",
      &snapserve::kernels::LinearInt8Panels);
  m.def(
      "linear_int8_panels_add_(Tensor(a!) out, Tensor x, Tensor blocks, int ggml_type, int cols, "
      "str isa, bool nibbles) -> Tensor(a!)",
      &snapserve::kernels::LinearInt8PanelsAdd);
  m.def(
      "linear_int8_panels_normed(Tensor x, Tensor norm_weight, float eps, Tensor blocks, "
      "int ggml_type, int cols, str isa, bool nibbles) -> Tensor",
      &snapserve::kernels::LinearInt8PanelsNormed);
  m.def(
      "linear_int8_panels_normed_out(Tensor(a!) out, Tensor x, Tensor norm_weight, float eps, "
      "Tensor blocks, int ggml_type, int cols, str isa, bool nibbles) -> Tensor(a!)",
      &snapserve::kernels::LinearInt8PanelsNormedOut);
  m.def(
      "linear_int8_panels_silu_add_(Tensor(a!) out, Tensor gate_up, Tensor blocks, int ggml_type, "
      "int cols, str isa, bool nibbles) -> Tensor(a!)",
      &snapserve::kernels::LinearInt8PanelsSiluAdd);
  m.def("has_amx_gemm(int n, int k) -> bool",
        [](int64_t n, int64_t k) { return snapserve::kernels::amx_gemm_fits(n, k); });
  m.def("pack_amx_weight(Tensor w) -> Tensor", &snapserve::kernels::pack_amx_weight);
  m.def("linear_amx(Tensor(a!) h, Tensor x, Tensor w, str out) -> Tensor",
        &snapserve::kernels::LinearAmx);
  m.def("mlp_amx_add_(Tensor(a!) h, Tensor x, Tensor gate_up, Tensor down) -> Tensor(a!)",
        &snapserve::kernels::MlpAmxAdd);
  m.def("linear_amx_normed(Tensor h, Tensor norm_weight, float eps, Tensor w) -> Tensor",
        &snapserve::kernels::LinearAmxNormed);
  m.def(
      "mlp_amx_normed_add_(Tensor(a!) h, Tensor norm_weight, float eps, Tensor gate_up, "
      "Tensor down) -> Tensor(a!)",
      &snapserve::kernels::MlpAmxNormedAdd);
  // RMSNorm (kernels/rowwise/rowwise.h), float32 or bfloat16 rows, for bench/ timing.
  m.def("rms_norm(Tensor x, Tensor w, float eps, bool bf16_out) -> Tensor",
        [](const at::Tensor& x, const at::Tensor& w, double eps, bool bf16) {
          return snapserve::kernels::rms_norm(x, w, eps, bf16 ? at::kBFloat16 : at::kFloat);
        });
  // The SwiGLU gate (kernels/rowwise/rowwise.h), for bench/ timing.
  m.def("silu_mul(Tensor gate_up, bool bf16_out) -> Tensor", [](const at::Tensor& g, bool bf16) {
    return snapserve::kernels::silu_mul(g, bf16 ? at::kBFloat16 : at::kFloat);
  });
}
