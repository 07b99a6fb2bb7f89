// The compression policy of one request (SnapKV or StreamingLLM): the
// server's defaults merged with the request's KvCompression overrides,
// validated once at admission so that no selector ever sees a bad parameter.
// Owns only parameter rules (docs/snapkv.md, "Parameters";
// docs/compression-policies.md; docs/api.md, "Validation"); applying the
// selection to a layer's K/V is the KV cache's business. Includes no LibTorch
// or gRPC header: the request-validation path can use it.
#pragma once

#include <cstdint>

#include "engine/common/status_or.h"
#include "engine/engine_types.h"
#include "kernels/snapkv_select.h"

namespace snapserve::compress {

// The types are the engine's (engine_types.h): KvCompressionConfig (every
// field set) and KvCompressionOverrides (a request's optional fields).
using engine::KvCompressionConfig;
using engine::KvCompressionOverrides;
using engine::KvMethod;

// Merges `request` over `server_default` and validates the result against the
// model's context length. Errors are InvalidArgument and name the field as the
// API spells it, e.g. "kv_compression.kernel_size: must be odd, got 4". With
// method kNone the other fields are unused and not validated; otherwise only
// the chosen method's fields (and C) are. The server should
// validate its own defaults at startup with an empty request.
StatusOr<KvCompressionConfig> ResolveCompression(const KvCompressionConfig& server_default,
                                                 const KvCompressionOverrides& request,
                                                 int64_t max_context);

// Prompt entries kept per layer and KV head for a prompt of n tokens: n when
// n <= C or the method is none (docs/snapkv.md, step 1), else C (every method
// keeps exactly C, so admission reserves C).
int64_t KeptEntries(const KvCompressionConfig& config, int64_t n);

// True when a prompt of n tokens gets compressed at all.
bool ShouldCompress(const KvCompressionConfig& config, int64_t n);

// The kernel parameters of a resolved SnapKV config.
kernels::SnapKvParams ToSnapKvParams(const KvCompressionConfig& config);

}  // namespace snapserve::compress
