// What the engine reports back: a request's results (ResultSink, Usage) and
// the batch-level figures for metrics (EngineStats, EngineObserver). Shared by
// the public engine.h and the scheduler, which produces them, so that
// scheduler/ needs no part of the public engine API. Includes no LibTorch,
// gRPC or protobuf header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/engine_types.h"
#include "engine/token_logprobs.h"

namespace snapserve::engine {

// One prompt chunk a step computed for a request.
struct PromptChunkTime {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t tokens = 0;
};

// When a request's phases ran, in nanoseconds since the Unix epoch: the
// scheduler keeps steady-clock instants and converts them once, when the
// request ends. 0: the phase never began. The server builds a request's trace
// spans from these (server/tracing/), so nothing is traced on the scheduler
// thread.
struct PhaseTimes {
  int64_t arrival_ns = 0;
  int64_t admitted_ns = 0;
  int64_t first_token_ns = 0;  // the end of the prompt's last chunk
  int64_t end_ns = 0;
  // Chunks whose K/V came from the prefix cache never ran and are not here.
  std::vector<PromptChunkTime> prompt_chunks;
};

struct Usage {
  uint32_t prompt_tokens = 0;
  // Of prompt_tokens, those whose K/V came from the prefix cache, or from
  // the document cache when document_cache_hit.
  uint32_t cached_prompt_tokens = 0;
  bool document_cache_hit = false;
  uint32_t completion_tokens = 0;
  uint32_t kv_prompt_entries = 0;      // per layer and KV head, before compression
  uint32_t kv_kept_entries = 0;        // after compression (mean per layer and KV head)
  uint64_t kv_kept_entries_total = 0;  // over every layer and KV head
  uint64_t kv_bytes_held = 0;          // bytes of the blocks holding them
  float compression_ratio = 1;
  double queue_ms = 0;
  double time_to_first_token_ms = 0;
  double total_ms = 0;
  double snapkv_ms = -1;  // < 0: no compression ran
  // The share of the observation window's attention on the prompt prefix that
  // the kept entries carry, mean over layers and KV heads (docs/snapkv.md,
  // "Retained attention"). < 0: no compression ran, or not measured.
  double retained_attention = -1;
  // The method applied to the prompt's KV: kNone when nothing was compressed
  // (method none, n <= C, or the request never got admitted).
  KvMethod kv_method = KvMethod::kNone;
  PhaseTimes phases;
};

// Where one request's results go. Called on the engine's thread: must return
// quickly and never call back into the engine.
class ResultSink {
 public:
  virtual ~ResultSink() = default;
  // New tokens and the text they complete (text never splits a UTF-8
  // character and never contains any part of a stop sequence); `logprobs`
  // is empty unless the request asked for them, and then has one entry per
  // token id, in the same order.
  virtual void OnDelta(const std::vector<uint32_t>& token_ids, const std::string& text,
                       const std::vector<TokenLogprob>& logprobs) = 0;
  // Called exactly once per enqueued request, last. `status` is OK, CANCELLED,
  // DEADLINE_EXCEEDED, UNAVAILABLE (shutdown) or INTERNAL.
  virtual void OnFinish(const Status& status, FinishReason reason, const Usage& usage) = 0;
};

// Batch-level figures for metrics, sampled by the caller at any time.
struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_total = 0;
  double kv_usage_ratio = 0;
  double prefix_cache_usage_ratio = 0;  // share of the prefix cache's memory in use
};

// Called on the engine thread after each decode step (metrics hooks).
struct EngineObserver {
  std::function<void(int64_t batch_size)> on_decode_step;
  std::function<void(double seconds)> on_inter_token_latency;
};

}  // namespace snapserve::engine
