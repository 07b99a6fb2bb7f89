#include "engine/compress/compression_policy.h"

#include <algorithm>
#include <cmath>
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

// AdaKV's and PyramidKV's own fields; they rank SnapKV's scores, so SnapKV's
// fields are checked too.
Status ValidateAdaptive(const KvCompressionConfig& config, int64_t max_context) {
  SNAPSERVE_RETURN_IF_ERROR(ValidateSnapKv(config, max_context));
  if (config.method == KvMethod::kAdaKv && !(config.adakv_alpha >= 0 && config.adakv_alpha <= 1)) {
    return Invalid("adakv_alpha_safeguard",
                   "must be in [0, 1], got " + std::to_string(config.adakv_alpha));
  }
  if (config.method == KvMethod::kPyramidKv && config.pyramid_beta < 1) {
    return Invalid("pyramid_beta",
                   "must be at least 1, got " + std::to_string(config.pyramid_beta));
  }
  return Status::Ok();
}

Status ValidateMethod(const KvCompressionConfig& config, int64_t max_context) {
  switch (config.method) {
    case KvMethod::kSnapKv:
      return ValidateSnapKv(config, max_context);
    case KvMethod::kStreamingLlm:
      return ValidateStreamingLlm(config);
    case KvMethod::kKeyDiff:  // C alone, checked below: KeyDiff has no window
      break;
    case KvMethod::kAdaKv:
    case KvMethod::kPyramidKv:
      return ValidateAdaptive(config, max_context);
    case KvMethod::kNone:
      break;
  }
  return Status::Ok();
}

// Python's round(): to the nearest integer, halves to the even one (kvpress
// rounds PyramidKV's budgets with it; docs/compression-policies.md).
int64_t RoundHalfEven(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

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
  if (request.adakv_alpha != 0) config.adakv_alpha = request.adakv_alpha;
  if (request.pyramid_beta != 0) config.pyramid_beta = request.pyramid_beta;
  if (config.method == KvMethod::kNone) return config;

  // Only the chosen method's fields are checked: a StreamingLLM request is not
  // refused over a SnapKV kernel size it never uses.
  SNAPSERVE_RETURN_IF_ERROR(ValidateMethod(config, max_context));
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

std::vector<int64_t> PyramidLayerBudgets(const KvCompressionConfig& config, int64_t n,
                                         int64_t num_layers) {
  // kvpress's PyramidKVPress.get_layer_budget, with its
  // max_capacity_prompt - window_size equal to our C (window included).
  const double c = static_cast<double>(config.capacity);
  const double w = static_cast<double>(config.window);
  const double beta = static_cast<double>(config.pyramid_beta);
  double min_num = c / beta;
  double max_num = 2 * c - min_num;
  if (max_num >= static_cast<double>(n) - w) {
    max_num = static_cast<double>(n) - w;
    min_num = 2 * c - max_num;
  }
  const bool pyramid =
      num_layers > 1 && static_cast<double>(n) >= max_num && max_num >= min_num && min_num >= w;
  std::vector<int64_t> budgets(static_cast<size_t>(num_layers), config.capacity);
  if (!pyramid) return budgets;  // no pyramid fits: SnapKV's uniform C
  const double steps = (max_num - min_num) / static_cast<double>(num_layers - 1);
  for (int64_t l = 0; l < num_layers; ++l)
    budgets[static_cast<size_t>(l)] = RoundHalfEven(max_num - static_cast<double>(l) * steps);
  return budgets;
}

std::vector<int64_t> LayerBudgets(const KvCompressionConfig& config, int64_t n,
                                  int64_t num_layers) {
  if (ShouldCompress(config, n) && config.method == KvMethod::kPyramidKv)
    return PyramidLayerBudgets(config, n, num_layers);
  return std::vector<int64_t>(static_cast<size_t>(num_layers), KeptEntries(config, n));
}

bool HeadsShareBudget(const KvCompressionConfig& config, int64_t n) {
  return ShouldCompress(config, n) && config.method == KvMethod::kAdaKv;
}

int64_t AdaKvHeadFloor(const KvCompressionConfig& config) {
  const auto at_least =
      static_cast<int64_t>(std::floor(config.adakv_alpha * static_cast<double>(config.capacity)));
  return std::min(config.capacity, std::max(at_least, config.window));
}

kernels::SnapKvParams ToSnapKvParams(const KvCompressionConfig& config) {
  return kernels::SnapKvParams{config.window, config.capacity, config.kernel_size, config.pooling,
                               config.group_reduce};
}

}  // namespace snapserve::compress
