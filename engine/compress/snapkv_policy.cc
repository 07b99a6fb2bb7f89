#include "engine/compress/snapkv_policy.h"

#include <string>

namespace snapserve::compress {

namespace {

Status Invalid(const char* field, const std::string& why) {
  return Status::InvalidArgument(std::string("kv_compression.") + field + ": " + why);
}

// SnapKV's own fields (docs/snapkv.md, "Parameters").
Status ValidateSnapKv(const KvCompressionConfig& config, int64_t max_context) {
  if (config.window < 1) {
    return Invalid("window_size", "must be at least 1, got " + std::to_string(config.window));
  }
  if (config.kernel_size < 1 || config.kernel_size % 2 == 0) {
    return Invalid("kernel_size", "must be odd, got " + std::to_string(config.kernel_size));
  }
  if (config.window >= config.capacity) {
    return Invalid("window_size", "must be less than max_capacity_prompt (" +
                                      std::to_string(config.window) +
                                      " >= " + std::to_string(config.capacity) + ")");
  }
  // Pooling costs O(n * k); a kernel wider than the context smooths nothing
  // more and only burns time.
  if (config.kernel_size > max_context) {
    return Invalid("kernel_size", "must be at most the model's context length (" +
                                      std::to_string(config.kernel_size) + " > " +
                                      std::to_string(max_context) + ")");
  }
  return Status::Ok();
}

// StreamingLLM's own field (docs/compression-policies.md): the sinks must
// leave room for at least one recent position, or it is no longer a window.
Status ValidateStreamingLlm(const KvCompressionConfig& config) {
  if (config.sink_tokens < 0) {
    return Invalid("sink_tokens", "must be at least 0, got " + std::to_string(config.sink_tokens));
  }
  if (config.sink_tokens >= config.capacity) {
    return Invalid("sink_tokens", "must be less than max_capacity_prompt (" +
                                      std::to_string(config.sink_tokens) +
                                      " >= " + std::to_string(config.capacity) + ")");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<KvCompressionConfig> ResolveCompression(const KvCompressionConfig& server_default,
                                                 const KvCompressionOverrides& request,
                                                 int64_t max_context) {
  KvCompressionConfig config = server_default;
  if (request.method) config.method = *request.method;
  if (request.window != 0) config.window = request.window;
  if (request.capacity != 0) config.capacity = request.capacity;
  if (request.kernel_size != 0) config.kernel_size = request.kernel_size;
  if (request.pooling) config.pooling = *request.pooling;
  if (request.sink_tokens != 0) config.sink_tokens = request.sink_tokens;
  if (config.method == KvMethod::kNone) return config;

  // Only the chosen method's fields are checked: a StreamingLLM request is not
  // refused over a SnapKV kernel size it never uses.
  SNAPSERVE_RETURN_IF_ERROR(config.method == KvMethod::kSnapKv ? ValidateSnapKv(config, max_context)
                                                               : ValidateStreamingLlm(config));
  if (config.capacity > max_context) {
    return Invalid("max_capacity_prompt", "must be at most the model's context length (" +
                                              std::to_string(config.capacity) + " > " +
                                              std::to_string(max_context) + ")");
  }
  return config;
}

bool ShouldCompress(const KvCompressionConfig& config, int64_t n) {
  return config.method != KvMethod::kNone && n > config.capacity;
}

int64_t KeptEntries(const KvCompressionConfig& config, int64_t n) {
  return ShouldCompress(config, n) ? config.capacity : n;
}

kernels::SnapKvParams ToSnapKvParams(const KvCompressionConfig& config) {
  return kernels::SnapKvParams{config.window, config.capacity, config.kernel_size, config.pooling,
                               config.group_reduce};
}

}  // namespace snapserve::compress
