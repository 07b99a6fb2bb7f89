// How the CPU linear multiplies bfloat16 weights at decode-sized m
// (kernels/linear/linear.h). A header of its own, without LibTorch, because the
// server's configuration (engine/engine_types.h) names it.
#pragma once

namespace snapserve::kernels {

enum class DecodeDot {
  // Activations stay float32 and each weight is widened to float32 (exact):
  // the weight-only bfloat16 model, whose only error is the weights'
  // rounding.
  kFloat32,
  // Activations rounded to bfloat16 once per call, and products of bfloat16
  // pairs accumulated in float32: vdpbf16ps on CPUs with AVX512_BF16
  // (kernels/linear/linear_cpu_avx512bf16.cc), elsewhere the same rounded values
  // through the float32 kernel. Together with --prefill-gemm=bfloat16 this
  // is bfloat16 compute throughout (docs/quantized-weights.md, "bfloat16
  // dot products at decode"). Other weight types ignore it.
  kBFloat16,
};

}  // namespace snapserve::kernels
