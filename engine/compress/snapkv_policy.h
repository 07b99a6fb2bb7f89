// The SnapKV compression policy of one request: the server's defaults merged
// with the request's KvCompression overrides, validated once at admission so
// that kernels/snapkv_select never sees a bad parameter. Owns only parameter
// rules (docs/snapkv.md, "Parameters"; docs/api.md, "Validation"); applying the
// selection to a layer's K/V is the KV cache's business. Includes no LibTorch
// or gRPC header: the request-validation path can use it.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/common/status_or.h"
#include "kernels/snapkv_select.h"

namespace snapserve::compress {

enum class Method { kNone, kSnapKv };

struct CompressionConfig {
  Method method = Method::kSnapKv;
  int64_t window = 32;      // w, the API's window_size
  int64_t capacity = 1024;  // C, the API's max_capacity_prompt (window included)
  int64_t kernel_size = 7;
  kernels::PoolingKind pooling = kernels::PoolingKind::kMax;
  // Server-side only (not in the API): how a GQA group's heads are combined.
  kernels::GroupReduce group_reduce = kernels::GroupReduce::kMean;
};

// A request's optional overrides, as the proto's KvCompression: 0 or unset
// means "use the server default".
struct CompressionRequest {
  std::optional<Method> method;
  uint32_t window = 0;
  uint32_t capacity = 0;
  uint32_t kernel_size = 0;
  std::optional<kernels::PoolingKind> pooling;
};

// Merges `request` over `server_default` and validates the result against the
// model's context length. Errors are InvalidArgument and name the field as the
// API spells it, e.g. "kv_compression.kernel_size: must be odd, got 4". With
// method kNone the other fields are unused and not validated. The server should
// validate its own defaults at startup with an empty request.
StatusOr<CompressionConfig> ResolveCompression(const CompressionConfig& server_default,
                                               const CompressionRequest& request,
                                               int64_t max_context);

// Prompt entries kept per layer and KV head for a prompt of n tokens: n when
// n <= C or the method is none (docs/snapkv.md, step 1), else C.
int64_t KeptEntries(const CompressionConfig& config, int64_t n);

// True when a prompt of n tokens gets compressed at all.
bool ShouldCompress(const CompressionConfig& config, int64_t n);

// The kernel parameters of a resolved SnapKV config.
kernels::SnapKvParams ToSnapKvParams(const CompressionConfig& config);

}  // namespace snapserve::compress
