// The continuous-batching loop (docs/kv-cache-and-scheduling.md, "The scheduler
// loop"; docs/architecture.md, "Threads and locks"). One thread owns every
// admitted sequence; each iteration it
//   1. takes new requests and cancellations from the inbox (under mu_),
//   2. asks Schedule() (step_planner.h) for a StepPlan: what ends, what is
//      admitted, which sequences decode and which prompt chunks run,
//   3. has its StepExecutor run it (step_executor.h; the engine's is the
//      ModelExecutor: model + paged KV cache, sampling),
//   4. has the OutputProcessor turn the sampled tokens into deltas, stops,
//      metrics and, at the end, Usage.
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

#include "engine/result_sink.h"
#include "engine/scheduler/output_processor.h"
#include "engine/scheduler/sequence.h"
#include "engine/scheduler/step_executor.h"
#include "engine/scheduler/step_plan.h"

namespace snapserve::scheduler {

// The engine fills every field from its EngineOptions, which hold the
// defaults (engine.h); none are repeated here.
struct SchedulerOptions {
  StepLimits limits;
  int64_t max_queue = 0;  // requests queued and not yet admitted
};

class Scheduler {
 public:
  // Starts the loop's thread, which owns `executor` until the destructor.
  Scheduler(std::unique_ptr<StepExecutor> executor, SchedulerOptions options);
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
  // Also starts the shared tier's lookups of the new requests' prefixes.
  void TakeInbox();
  // Releases the requests whose lookups ended or ran out of time.
  void EndFetches();
  // Describes the queue and the admitted sequences for Schedule().
  ScheduleInput DescribeState(Clock::time_point now) const;
  void Apply(const StepPlan& plan);
  void EndRequest(int64_t id);
  void Admit(int64_t id);
  // Runs the plan's decode batch and prompt chunks, then their outputs.
  void RunStep(const StepPlan& plan);
  void Finish(std::unique_ptr<Sequence> seq, const Ending& ending);
  void PublishStats();

  const SchedulerOptions options_;
  const std::unique_ptr<StepExecutor> executor_;
  OutputProcessor output_;

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
  std::atomic<double> prefix_cache_usage_ratio_{0};

  // Scheduler thread only. A sequence is in exactly one of the three.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> prefilling_;  // admitted, FCFS
  std::vector<std::unique_ptr<Sequence>> decoding_;
  std::thread thread_;
};

}  // namespace snapserve::scheduler
