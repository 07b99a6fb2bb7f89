// The precision preset (`--precision`): one choice that sets the kernel paths
// of a deployment (the GGUF decode dot, the prompt GEMM, the KV cache's
// element type, the block size), resolved once at start-up from the hardware
// and the model's format. Each detailed setting may still be given on its
// own; an explicit setting always wins over the preset.
//
// Presets:
//   auto   the fastest paths this hardware has (the default; see ResolvePrecision)
//   exact  float32 arithmetic throughout: the decoded model's numbers, which
//          transformers reproduces (bit-exact kernels; KV in the model dtype)
//   int8   int8 products wherever a kernel exists, int8 KV cache
//   bf16   bfloat16 prompt GEMMs and KV cache, float32 decode of GGUF blocks
// docs/quantized-weights.md ("Precision presets") says what each costs in
// accuracy and which test measures it.
#pragma once

#include <optional>
#include <string>

#include "engine/engine.h"

namespace snapserve::engine {

enum class Precision { kAuto, kExact, kInt8, kBFloat16 };

const char* precision_name(Precision p);

// The settings a user gave explicitly, which the preset leaves alone.
struct PrecisionOverrides {
  std::optional<Dtype> dtype;
  std::optional<QuantDot> quantized_dot;
  std::optional<PrefillGemm> prefill_gemm;
  std::optional<DecodeDot> decode_dot;
  std::optional<Dtype> kv_cache_dtype;
  std::optional<int> block_size;
};

// What the choice depends on, detected once (DetectHardware) or written by a
// test.
struct HardwareFacts {
  bool cuda = false;  // the model runs on a CUDA device
  // CPU kernel paths (kernels/cpu/cpu_isa.h), under any SNAPSERVE_CPU_ISA cap.
  const char* isa_name = "portable";
  bool avx2 = false;         // the AVX2 int8 block dot
  bool avx512 = false;       // AVX-512F: decode attention reads an int8 cache in place
  bool int8_panels = false;  // AVX-512 VNNI: the int8 prompt GEMM and decode panels
  bool avx512_bf16 = false;  // vdpbf16ps: a native bfloat16 GEMM
  bool amx = false;          // AMX tiles: the fastest bfloat16 prompt GEMM
  bool gguf_blocks = false;  // the model is a GGUF file (block-quantized matrices)
};

HardwareFacts DetectHardware(const Device& device, const std::string& model_path);

// Writes the preset's settings into `options` (dtype, linear_precision,
// kv_cache_dtype, block_size), each explicit one in
// `overrides` winning. Returns the one line the server logs, e.g.
// "precision auto: decode int8 dot (avx2), prefill float32, dtype float32, KV float32,
// block 64".
std::string ResolvePrecision(Precision preset, const PrecisionOverrides& overrides,
                             const HardwareFacts& hw, EngineOptions& options);

}  // namespace snapserve::engine
