// StreamingLLM (arXiv 2309.17453) applied to a prompt: every layer and KV head
// keeps the first `sink_tokens` positions (the attention sinks) and the most
// recent C - sink_tokens positions; the middle is dropped. There is no
// scoring and no observation window, so the selector ignores the queries and
// the model need not keep any (docs/compression-policies.md).
#pragma once

#include <cstdint>

#include "engine/compress/snapkv_policy.h"
#include "engine/kv/paged_kv_cache.h"

namespace snapserve::compress {

// The prompt positions kept out of n: [0, sink) then [n - (C - sink), n), in
// increasing order. Needs sink < C < n (ResolveCompression and ShouldCompress
// guarantee it); a prompt of at most C positions is never compressed.
struct StreamingLlmSpan {
  int64_t sink = 0;          // positions [0, sink)
  int64_t recent_begin = 0;  // positions [recent_begin, n)
};
StreamingLlmSpan StreamingLlmKept(int64_t n, int64_t capacity, int64_t sink_tokens);

// A selector keeping StreamingLLM's positions for `config` (which must be
// StreamingLLM and apply to the prompt: ShouldCompress).
kv::KvSelector MakeStreamingLlmSelector(const KvCompressionConfig& config);

}  // namespace snapserve::compress
