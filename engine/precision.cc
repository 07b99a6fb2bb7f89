#include "engine/precision.h"

#include "kernels/cpu/cpu_isa.h"

namespace snapserve::engine {
namespace {

// One preset's choice before the explicit settings are applied.
struct Choice {
  std::optional<Dtype> dtype;           // unset: keep the configured model dtype
  model::LinearPrecision linear;        // the exact paths unless the preset says otherwise
  std::optional<Dtype> kv_cache_dtype;  // unset: the model dtype
  int block_size = 16;
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The prompt GEMM with the most throughput here. AMX tiles multiply
// bfloat16 fastest of all; below them VNNI's int8 panels do twice the
// multiply-adds of vdpbf16ps for GGUF blocks; a native bfloat16 GEMM beats
// float32 for dense matrices; without AVX512_BF16, oneDNN emulates bfloat16
// and float32 (MKL's sgemm) is faster.
PrefillGemm FastestPrefillGemm(const HardwareFacts& hw) {
  if (hw.amx) return PrefillGemm::kBFloat16;
  if (hw.int8_panels && hw.gguf_blocks) return PrefillGemm::kInt8;
  if (hw.avx512_bf16) return PrefillGemm::kBFloat16;
  return PrefillGemm::kFloat32;
}

Choice CpuChoice(Precision preset, const HardwareFacts& hw, Dtype model_dtype) {
  Choice c;
  switch (preset) {
    case Precision::kExact:
      return c;
    case Precision::kAuto:
      // A decode step streams every weight and every cached entry: int8
      // block dots read the fewest weight bytes on every ISA with a SIMD
      // int8 dot. An int8 cache pays only where decode attention reads it in
      // place (AVX-512); below that each block is widened to float32 first,
      // which costs more than the bytes it saves. Larger blocks make the
      // paged attention's inner loops longer and its block tables shorter.
      c.linear.dot = hw.avx2 ? QuantDot::kInt8 : QuantDot::kExact;
      c.linear.prefill = FastestPrefillGemm(hw);
      c.kv_cache_dtype = hw.avx512 ? std::optional<Dtype>(Dtype::kInt8) : std::nullopt;
      c.block_size = 64;
      if (model_dtype == Dtype::kBFloat16 && hw.avx512_bf16) c.linear.decode = DecodeDot::kBFloat16;
      return c;
    case Precision::kInt8:
      c.linear.dot = QuantDot::kInt8;
      // Without VNNI there are no int8 prompt panels, and kInt8 would fall
      // back to an emulated bfloat16 GEMM: float32 is the int8 preset's
      // prompt GEMM there.
      c.linear.prefill = hw.int8_panels ? PrefillGemm::kInt8 : PrefillGemm::kFloat32;
      c.kv_cache_dtype = Dtype::kInt8;
      c.block_size = 64;
      return c;
    case Precision::kBFloat16:
      c.linear.prefill = PrefillGemm::kBFloat16;
      c.kv_cache_dtype = Dtype::kBFloat16;
      c.block_size = 64;
      if (model_dtype == Dtype::kBFloat16) c.linear.decode = DecodeDot::kBFloat16;
      return c;
  }
  return c;
}

// On CUDA the CPU kernel paths do not apply: the presets choose the dtype the
// GPU computes in (its tensor cores take bfloat16; exact keeps float32) and
// the KV cache follows the model dtype (int8 entries exist on CPU only).
Choice CudaChoice(Precision preset) {
  Choice c;
  if (preset != Precision::kExact) c.dtype = Dtype::kBFloat16;
  return c;
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kAuto:
      return "auto";
    case Precision::kExact:
      return "exact";
    case Precision::kInt8:
      return "int8";
    case Precision::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

HardwareFacts DetectHardware(const Device& device, const std::string& model_path) {
  HardwareFacts hw;
  hw.cuda = device.is_cuda();
  const kernels::CpuIsa isa = kernels::cpu_isa();
  hw.isa_name = kernels::cpu_isa_name(isa);
  hw.avx2 = isa >= kernels::CpuIsa::kAvx2;
  hw.avx512 = isa >= kernels::CpuIsa::kAvx512;
  hw.int8_panels = isa >= kernels::CpuIsa::kAvx512Vnni;
  hw.avx512_bf16 = kernels::has_avx512_bf16();
  hw.amx = kernels::has_amx_bf16();
  hw.gguf_blocks = EndsWith(model_path, ".gguf");
  return hw;
}

std::string ResolvePrecision(Precision preset, const PrecisionOverrides& overrides,
                             const HardwareFacts& hw, EngineOptions& options) {
  const Dtype configured_dtype = overrides.dtype.value_or(options.dtype);
  const Choice c = hw.cuda ? CudaChoice(preset) : CpuChoice(preset, hw, configured_dtype);
  options.dtype = overrides.dtype.value_or(c.dtype.value_or(options.dtype));
  model::LinearPrecision& linear = options.linear_precision;
  linear.dot = overrides.quantized_dot.value_or(c.linear.dot);
  linear.prefill = overrides.prefill_gemm.value_or(c.linear.prefill);
  linear.decode = overrides.decode_dot.value_or(c.linear.decode);
  options.kv_cache_dtype = overrides.kv_cache_dtype ? overrides.kv_cache_dtype : c.kv_cache_dtype;
  options.block_size = overrides.block_size.value_or(c.block_size);

  const Dtype kv = options.kv_cache_dtype.value_or(default_kv_cache_dtype(options.dtype));
  std::string line = std::string("precision ") + precision_name(preset) + ": ";
  if (hw.cuda) {
    line += std::string("dtype ") + dtype_name(options.dtype);
  } else {
    line += std::string("decode ") +
            (linear.dot == QuantDot::kInt8 ? std::string("int8 dot (") + hw.isa_name + ")"
                                           : std::string("exact dot (") + hw.isa_name + ")") +
            ", prefill " + prefill_gemm_name(linear.prefill) +
            (linear.prefill == PrefillGemm::kBFloat16 && hw.amx ? " (amx)" : "") + ", dtype " +
            dtype_name(options.dtype);
    if (linear.decode == DecodeDot::kBFloat16) line += ", bfloat16 decode dot";
  }
  line += std::string(", KV ") + dtype_name(kv) + ", block " + std::to_string(options.block_size);
  return line;
}

}  // namespace snapserve::engine
