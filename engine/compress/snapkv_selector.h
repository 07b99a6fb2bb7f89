// Applies a request's SnapKV policy to its KV cache: builds the per-sequence
// KvSelector that PagedKvCache calls right after each prefill layer's
// attention (docs/snapkv.md, step 9), so only one layer's full K/V is alive at a
// time. The selection itself is kernels/snapkv_select; this file only cuts
// the observation window out of the queries and times the work.
#pragma once

#include <memory>

#include "engine/compress/snapkv_policy.h"
#include "engine/kv/paged_kv_cache.h"

namespace snapserve::compress {

// Time spent selecting, summed over the layers of one request.
struct SelectionTimer {
  double seconds = 0;
};

// A selector keeping the SnapKV selection of `config` (which must be SnapKV
// and apply to the prompt: ShouldCompress). `timer` may be null.
kv::KvSelector MakeSnapKvSelector(const KvCompressionConfig& config,
                                  std::shared_ptr<SelectionTimer> timer);

}  // namespace snapserve::compress
