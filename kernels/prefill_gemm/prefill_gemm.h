// The precision of the CPU linear's GEMM at prompt-sized m (kernels/linear/linear.h).
// A header of its own, without LibTorch, because the server's configuration
// (engine/engine_types.h) names it.
#pragma once

namespace snapserve::kernels {

// The GEMM of prompt-sized m (more than kLinearSmallRows rows).
enum class PrefillGemm {
  // float32 inputs and products (MKL's sgemm): the decoded model's numbers.
  kFloat32,
  // x and the weight slices rounded to bfloat16, products accumulated in
  // float32 by oneDNN (or our AMX tiles, kernels/prefill_gemm/prefill_gemm_amx.h), the
  // result rounded to bfloat16 and widened back. On a CPU with AVX512_BF16
  // the products of bfloat16 pairs are native (and on AMD CPUs MKL's sgemm
  // takes its generic AVX2 path); elsewhere oneDNN emulates them, slower
  // than float32.
  kBFloat16,
  // GGUF legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) multiplied as int8 by
  // AVX-512 VNNI, the activations quantized per 32-block as the decode int8
  // dot does (kernels/prefill_gemm/prefill_gemm_int8.h); any other matrix, and the
  // prompt's attention, as under kBFloat16.
  kInt8,
};

}  // namespace snapserve::kernels
