// The engine's vocabulary: one type per concept (KV method, pooling, dtype,
// device, finish reason, compression parameters), shared by the public engine.h and
// the engine's own modules (compress/, sampling/, scheduler/), and the one
// spelling of each value. Strings are parsed into these types in exactly one
// place, server/server_config.cc (flags); the proto's enums are converted in
// server/request_conversion.cc. Includes no LibTorch, gRPC or protobuf header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/linear/decode_dot.h"
#include "kernels/prefill_gemm/prefill_gemm.h"
#include "kernels/quant/quant_blocks.h"
#include "kernels/snapkv_select/snapkv_select.h"

namespace snapserve::engine {

// How a request's prompt KV entries are kept: all of them, SnapKV's scored
// pick, or StreamingLLM's attention sinks plus the most recent positions
// (docs/compression-policies.md).
// docs/compression-policies.md: kAdaKv and kPyramidKv rank SnapKV's scores
// with head-adaptive / layer-pyramid budgets; kKeyDiff keeps the keys least
// like their head's mean key, reading no query.
enum class KvMethod { kNone, kSnapKv, kStreamingLlm, kAdaKv, kPyramidKv, kKeyDiff };

// How SnapKV smooths its per-position scores: the kernel's own enum.
using KvPooling = kernels::PoolingKind;

// How decode steps multiply GGUF weights kept in blocks: the kernel's own enum
// (exact decoding, or int8 block dot products).
using QuantDot = kernels::QuantDot;
using PrefillGemm = kernels::PrefillGemm;
using DecodeDot = kernels::DecodeDot;

// A tensor element type: the model's weights and compute, the KV cache's
// entries. kInt8 is for the KV cache only (CPU: int8 values with a float32
// scale per 16, kernels/kv_append/kv_append.h); no model computes in it.
enum class Dtype { kFloat32, kBFloat16, kFloat16, kInt8 };

// The KV cache dtype when none is chosen: the model's own (float32 keeps the
// cache exact; a bfloat16 or float16 model's entries are already rounded).
inline Dtype default_kv_cache_dtype(Dtype model_dtype) { return model_dtype; }

// Where the model runs: the CPU, or a CUDA device (index -1: the current one).
struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = -1;  // kCuda only

  static Device Cpu() { return {}; }
  static Device Cuda(int index = -1) { return {Kind::kCuda, index}; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  bool operator==(const Device&) const = default;
};

// Why a request stopped generating; kUnspecified when it ended with an error.
enum class FinishReason { kUnspecified, kLength, kEos, kStopSequence, kStopToken };

// A compression configuration with every field set: the server's defaults,
// and a request's after its overrides are merged in (compress/compression_policy.h).
// Each method reads only its own fields (C is every method's).
struct KvCompressionConfig {
  KvMethod method = KvMethod::kSnapKv;
  int64_t window = 32;      // SnapKV's w, the API's window_size
  int64_t capacity = 1024;  // C, the API's max_capacity_prompt (SnapKV: window included)
  int64_t kernel_size = 7;  // SnapKV
  KvPooling pooling = KvPooling::kMax;  // SnapKV
  int64_t sink_tokens = 4;    // StreamingLLM's always-kept first positions (the paper's 4)
  double adakv_alpha = 0.2;   // AdaKV: share of C every KV head keeps at least (kvpress's 0.2)
  int64_t pyramid_beta = 20;  // PyramidKV: steepness; the last layer keeps about C / beta
  // Server-side only (not in the API): how a GQA group's heads are combined.
  kernels::GroupReduce group_reduce = kernels::GroupReduce::kMean;
};

// A request's optional overrides, as the API's KvCompression: 0 or unset
// means "use the server default".
struct KvCompressionOverrides {
  std::optional<KvMethod> method;
  uint32_t window = 0;
  uint32_t capacity = 0;
  uint32_t kernel_size = 0;
  std::optional<KvPooling> pooling;
  uint32_t sink_tokens = 0;
  double adakv_alpha = 0;  // 0: default
  uint32_t pyramid_beta = 0;
};

// The one spelling of each value, as flags, logs and ModelInfo write them:
// "snapkv"/"streaming_llm"/"adakv"/"pyramidkv"/"keydiff"/"none", "max"/"avg",
// "float32"/"bfloat16"/"float16", "cpu"/"cuda"/"cuda:N",
// "length"/"eos"/"stop_sequence"/"stop_token".
const char* kv_method_name(KvMethod method);
const char* kv_pooling_name(KvPooling pooling);
const char* dtype_name(Dtype dtype);
const char* quant_dot_name(QuantDot dot);         // "exact", "int8"
const char* prefill_gemm_name(PrefillGemm gemm);  // "float32", "bfloat16", "int8"
const char* decode_dot_name(DecodeDot dot);       // "float32", "bfloat16"
std::string device_name(const Device& device);
const char* finish_reason_name(FinishReason reason);

}  // namespace snapserve::engine
