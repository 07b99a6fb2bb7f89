// How one matrix of a linear layer is multiplied: the kernel chosen once per
// matrix when the model is loaded, for prompt-sized and for decode-sized
// inputs, and the repacked data that kernel reads (int8 panels, AMX tiles, a
// bfloat16 copy). The loaders make the weights as the file holds them
// (weights.h); PrepareLinearMethod then chooses, from the linear precision
// (linear_precision.h), the CPU's ISA and the matrix's format, and repacks;
// ApplyLinear multiplies with what was chosen. The forward pass
// (llama_model.h) asks a matrix's method, never the precision, which kernel
// serves it.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "engine/model/linear_precision.h"
#include "kernels/linear/linear.h"
#include "kernels/prefill_gemm/prefill_gemm_int8.h"

namespace snapserve::model {

struct LinearWeight;  // weights.h: it holds its LinearMethod
struct LlamaWeights;

// The kernel that serves one size of input.
enum class LinearKernel {
  kUnprepared,    // PrepareLinearMethod has not run (the embedding): no products
  kInt8Panels,    // kernels::linear_int8_panels, one set of panels per part
  kAmxTiles,      // kernels::linear_amx on the matrix's bfloat16 AMX tiles
  kBFloat16Copy,  // kernels::linear_float32 on a bfloat16 copy (prompt GEMM)
  kGgufBlocks,    // kernels::linear_quantized, one call per part
  kDenseCpu,      // kernels::linear_float32 on the dense float32/bfloat16 weight
  kAtLinear,      // at::linear (other devices and dtypes)
};

// Which products a matrix serves: a layer's of every size; the LM head's,
// which a prompt asks for one row of logits, decode-sized ones only (it
// gets no prompt repacking).
enum class LinearUse { kLayer, kLmHead };

struct LinearMethod {
  LinearKernel prompt = LinearKernel::kUnprepared;  // x of more than kLinearSmallRows rows
  LinearKernel decode = LinearKernel::kUnprepared;  // x of at most kLinearSmallRows rows
  LinearPrecision precision;
  // kInt8Panels' data, one per part (kernels/prefill_gemm/prefill_gemm_int8.h):
  // byte panels for prompts under --prefill-gemm=int8, and panels for
  // decode-sized batches under --quantized-dot=int8 (nibbles for 4-bit
  // types: decode reads every weight each step; the same bits).
  std::vector<kernels::Int8Panels> prompt_panels, decode_panels;
  // kBFloat16Copy's weight: the matrix decoded and rounded to bfloat16 once,
  // so that no prompt chunk decodes and rounds it again.
  at::Tensor bf16_copy;
  // kAmxTiles' weight: the same rounding laid out as AMX tiles
  // (kernels/prefill_gemm/prefill_gemm_amx.h), in place of bf16_copy.
  at::Tensor amx_tiles;
  // Bytes of the panels, copy and tiles this matrix holds beside its weights.
  int64_t repacked_bytes = 0;

  LinearKernel kernel_for(int64_t rows) const {
    return rows > kernels::kLinearSmallRows ? prompt : decode;
  }
  // The panels a product of `rows` rows uses (empty unless kInt8Panels).
  const std::vector<kernels::Int8Panels>& panels_for(int64_t rows) const {
    return rows > kernels::kLinearSmallRows ? prompt_panels : decode_panels;
  }
  // Whether `rows` rows are multiplied on AMX tiles, which round the input
  // to bfloat16 first: a producer may hand them bfloat16
  // (kernels/rowwise/rowwise.h).
  bool takes_bfloat16(int64_t rows) const { return kernel_for(rows) == LinearKernel::kAmxTiles; }
  // The one set of int8 panels that `rows` rows use, where the step before
  // may run inside their quantization; nullptr when the kernel is another,
  // or the matrix has several block types (a set per part).
  const kernels::Int8Panels* single_panels(int64_t rows) const {
    const std::vector<kernels::Int8Panels>& panels = panels_for(rows);
    return panels.size() == 1 ? &panels[0] : nullptr;
  }
};

// Chooses w's kernels and makes what they read, on the calling thread.
// On CPU: int8 panels for GGUF legacy blocks where the CPU has VNNI (for
// prompts under PrefillGemm::kInt8, for decode under QuantDot::kInt8);
// under kBFloat16 or kInt8, the prompts of every other layer matrix take a
// bfloat16 copy, as AMX tiles where the CPU has AMX and the shape fits.
LinearMethod PrepareLinearMethod(const LinearWeight& w, const LinearPrecision& precision,
                                 at::Device device, LinearUse use);
// PrepareLinearMethod for the LM head and every layer's matrices (the
// embedding only gathers rows and keeps none).
void PrepareLinearMethods(LlamaWeights& weights, const LinearPrecision& precision,
                          at::Device device);

// x [m, in] in the compute dtype -> x · wᵀ [m, out], by w.method.
at::Tensor ApplyLinear(const LinearWeight& w, const at::Tensor& x);
// ApplyLinear, except that the bfloat16 prompt GEMMs leave their product in
// bfloat16 (kernels::linear_bf16_gemm, AmxOut::kBFloat16), for a consumer
// that widens it as it reads.
at::Tensor ApplyLinearWidenedLater(const LinearWeight& w, const at::Tensor& x);
// h += x · wᵀ (h the float32 residual rows): in the int8 panels' or AMX
// tiles' own store where x's rows take them (no intermediate tensor, no
// separate add; the same bits), else h.add_(ApplyLinear(w, x)).
void AddLinear(at::Tensor& h, const LinearWeight& w, const at::Tensor& x);

}  // namespace snapserve::model
