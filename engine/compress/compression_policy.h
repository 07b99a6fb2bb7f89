// The compression policy of one request (any KvMethod): the
// server's defaults merged with the request's KvCompression overrides,
// validated once at admission so that no selector ever sees a bad parameter.
// Owns only parameter rules (docs/snapkv.md, "Parameters";
// docs/compression-policies.md; docs/api.md, "Validation"); applying the
// selection to a layer's K/V is the KV cache's business. Includes no LibTorch
// or gRPC header: the request-validation path can use it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/common/status_or.h"
#include "engine/engine_types.h"
#include "kernels/snapkv_select/snapkv_select.h"

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
// n <= C or the method is none (docs/snapkv.md, step 1), else C. For PyramidKV
// and AdaKV it is the mean over layers and KV heads (LayerBudgets says more).
int64_t KeptEntries(const KvCompressionConfig& config, int64_t n);

// Prompt entries each KV head of layer l keeps, l = 0 .. num_layers-1: every
// layer KeptEntries(config, n), except PyramidKV's decreasing budgets
// (PyramidLayerBudgets). With AdaKV (HeadsShareBudget) a layer's heads keep
// budget * num_kv_heads entries together, split unevenly.
std::vector<int64_t> LayerBudgets(const KvCompressionConfig& config, int64_t n, int64_t num_layers);

// PyramidKV's per-layer budgets for a compressed prompt of n > C tokens
// (docs/compression-policies.md, "PyramidKV"): a straight line from layer 0 to
// the last with mean C, steepness pyramid_beta, kvpress's rounding; SnapKV's
// uniform C where no such line fits.
std::vector<int64_t> PyramidLayerBudgets(const KvCompressionConfig& config, int64_t n,
                                         int64_t num_layers);

// True when the KV heads of a layer split its budget unevenly (AdaKV applied).
bool HeadsShareBudget(const KvCompressionConfig& config, int64_t n);

// AdaKV's safeguard: entries every KV head keeps at least, window included:
// floor(adakv_alpha * C), but never fewer than the window (always kept).
int64_t AdaKvHeadFloor(const KvCompressionConfig& config);

// True when a prompt of n tokens gets compressed at all.
bool ShouldCompress(const KvCompressionConfig& config, int64_t n);

// The kernel parameters of a resolved SnapKV config.
kernels::SnapKvParams ToSnapKvParams(const KvCompressionConfig& config);

}  // namespace snapserve::compress
