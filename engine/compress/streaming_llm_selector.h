// StreamingLLM (arXiv 2309.17453) applied to a prompt: every layer and KV head
// keeps the first `sink_tokens` positions (the attention sinks) and the most
// recent C - sink_tokens positions; the middle is dropped. There is no
// scoring: the queries are used only to report the retained attention of what
// was kept (docs/compression-policies.md, "Retained attention"), with
// kernels::snapkv_scores over the config's observation window.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/compress/compression_policy.h"
#include "engine/compress/snapkv_selector.h"
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

// The observation window the retained attention of a StreamingLLM request is
// measured with: config.window when 1 <= window < n (the config's window is
// not validated for StreamingLLM), else 0 (not measured).
int64_t StreamingLlmScoreWindow(const KvCompressionConfig& config, int64_t n);

// A selector keeping StreamingLLM's positions for `config` (which must be
// StreamingLLM and apply to the prompt: ShouldCompress). When `retained` is
// set, the queries the selector gets must hold at least
// StreamingLlmScoreWindow(config, n) rows (or none: then nothing is measured).
kv::KvSelector MakeStreamingLlmSelector(const KvCompressionConfig& config,
                                        std::shared_ptr<RetainedAttention> retained = nullptr);

}  // namespace snapserve::compress
