#include "engine/engine_types.h"

namespace snapserve::engine {

const char* kv_method_name(KvMethod method) {
  switch (method) {
    case KvMethod::kNone:
      return "none";
    case KvMethod::kSnapKv:
      return "snapkv";
    case KvMethod::kStreamingLlm:
      return "streaming_llm";
    case KvMethod::kAdaKv:
      return "adakv";
    case KvMethod::kPyramidKv:
      return "pyramidkv";
    case KvMethod::kKeyDiff:
      return "keydiff";
  }
  return "unknown";
}

const char* kv_pooling_name(KvPooling pooling) {
  switch (pooling) {
    case KvPooling::kMax:
      return "max";
    case KvPooling::kAvg:
      return "avg";
  }
  return "unknown";
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kFloat16:
      return "float16";
    case Dtype::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* quant_dot_name(QuantDot dot) {
  switch (dot) {
    case QuantDot::kExact:
      return "exact";
    case QuantDot::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* prefill_gemm_name(PrefillGemm gemm) {
  switch (gemm) {
    case PrefillGemm::kFloat32:
      return "float32";
    case PrefillGemm::kBFloat16:
      return "bfloat16";
    case PrefillGemm::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* decode_dot_name(DecodeDot dot) {
  switch (dot) {
    case DecodeDot::kFloat32:
      return "float32";
    case DecodeDot::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

std::string device_name(const Device& device) {
  if (!device.is_cuda()) return "cpu";
  return device.index < 0 ? "cuda" : "cuda:" + std::to_string(device.index);
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kUnspecified:
      break;
  }
  return "unspecified";
}

}  // namespace snapserve::engine
