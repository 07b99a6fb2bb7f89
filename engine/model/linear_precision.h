// The precision of the model's linear layers: one value, set when the model
// is loaded (LoadModel), from which each matrix's kernel is chosen once
// (engine/model/linear_method.h). The server resolves it from --precision and
// the detailed flags (engine/precision.h); each field is one of those flags.
// No LibTorch here: the engine's options name these enums too.
#pragma once

#include "kernels/linear/decode_dot.h"
#include "kernels/prefill_gemm/prefill_gemm.h"
#include "kernels/quant/quant_blocks.h"

namespace snapserve::model {

struct LinearPrecision {
  // How decode-sized batches multiply GGUF blocks (--quantized-dot).
  kernels::QuantDot dot = kernels::QuantDot::kExact;
  // The GEMM of prompt-sized batches on CPU (--prefill-gemm).
  kernels::PrefillGemm prefill = kernels::PrefillGemm::kFloat32;
  // How decode-sized batches multiply dense bfloat16 weights on CPU
  // (--decode-dot).
  kernels::DecodeDot decode = kernels::DecodeDot::kFloat32;

  // The prompt GEMM of what has no int8 panels (dense and K-quant matrices,
  // the prompt's attention): kBFloat16 under kInt8, else `prefill`.
  kernels::PrefillGemm float_prefill() const {
    return prefill == kernels::PrefillGemm::kFloat32 ? kernels::PrefillGemm::kFloat32
                                                     : kernels::PrefillGemm::kBFloat16;
  }
};

}  // namespace snapserve::model
