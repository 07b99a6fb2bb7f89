// The continuous-batching loop (docs/kv-cache-and-scheduling.md, "The scheduler
// loop"; docs/architecture.md, "Threads and locks"). One thread owns the model,
// the paged KV cache and every admitted sequence. Each iteration it
//   1. takes new requests and cancellations from the inbox,
//   2. ends cancelled and expired requests (blocks freed at once),
//   3. admits waiting requests FCFS while blocks, batch room and the prefill
//      budget allow (admission_policy.h),
//   4. advances admitted prompts' prefill layer by layer, SnapKV compressing
//      each layer's K/V as it goes; while other sequences are decoding, only
//      about prefill_chunk_tokens tokens' worth of layers per iteration, so a
//      long prompt arriving delays running streams by one slice, not by its
//      whole prefill,
//   5. runs one batched decode step for every running sequence,
//   6. samples, detokenizes, matches stops and streams deltas to each sink.
// Other threads only touch the inbox, the cancellation set and the observer
// (under mu_) and atomic statistics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama_model.h"
#include "engine/result_sink.h"
#include "engine/scheduler/sequence.h"

namespace snapserve::scheduler {

// The engine fills every field from its EngineOptions, which hold the
// defaults (engine.h); none are repeated here.
struct SchedulerOptions {
  int64_t max_batch_size = 0;
  int64_t max_queue = 0;
  // Prompt tokens admitted into prefill per iteration (and in prefill at once).
  int64_t max_prefill_tokens_per_step = 0;
  // While sequences are decoding, the prefill work done between two decode
  // steps: prefill_chunk_tokens x num_layers token-layers, in whole layers (at
  // least one per prompt). 0: every prompt's prefill runs whole.
  int64_t prefill_chunk_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(model::LlamaModel& model, kv::PagedKvCache& cache,
            const tokenizer::Tokenizer& tokenizer, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence. RESOURCE_EXHAUSTED when the waiting queue is full,
  // UNAVAILABLE after Shutdown. On OK its sink will finish exactly once.
  Status Submit(std::unique_ptr<Sequence> seq);
  void Cancel(const std::string& request_id);
  // Ends every request with UNAVAILABLE and joins the thread. Idempotent.
  void Shutdown();

  engine::EngineStats Stats() const;
  void SetObserver(engine::EngineObserver observer);

 private:
  void Loop();
  void TakeInbox();
  void EndCancelledAndExpired(Clock::time_point now);
  void Admit();
  void StartPrefill(std::unique_ptr<Sequence> seq);
  void AdvancePrefills();
  void FinishPrefill(std::unique_ptr<Sequence> seq);
  void DecodeStep();
  // Feeds one sampled token through stop matching and streaming; sets
  // *finished to true when the sequence finished (its sink got OnFinish and its
  // blocks were freed; the caller drops it), else to false.
  void HandleToken(Sequence& seq, int32_t token, Clock::time_point now, bool* finished);
  void Finish(Sequence& seq, const Status& status, engine::FinishReason reason);
  void PublishStats();

  model::LlamaModel& model_;
  kv::PagedKvCache& cache_;
  const tokenizer::Tokenizer& tokenizer_;
  const SchedulerOptions options_;

  // Shared with other threads.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::unordered_set<std::string> cancels_;
  bool stopping_ = false;
  engine::EngineObserver observer_;
  std::atomic<int64_t> queued_{0};  // inbox + waiting, bounded by max_queue
  std::atomic<int64_t> running_count_{0};
  std::atomic<int64_t> free_blocks_{0};
  std::atomic<double> usage_ratio_{0};

  // Scheduler thread only.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> prefilling_;  // admitted, FCFS
  std::vector<std::unique_ptr<Sequence>> running_;     // decoding
  std::thread thread_;
};

}  // namespace snapserve::scheduler
