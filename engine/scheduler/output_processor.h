// OutputProcessor: what happens to a sampled token after the model ran
// (docs/kv-cache-and-scheduling.md, "The scheduler loop"): stop matching,
// incremental detokenization, streaming deltas to the request's sink, the
// per-token metrics, and the final Usage. It never touches the model or the
// cache, and it calls the metrics observer without holding any lock: the
// scheduler hands it a copy of the observer each step.
#pragma once

#include <optional>

#include "engine/common/status.h"
#include "engine/result_sink.h"
#include "engine/scheduler/sequence.h"

namespace snapserve::scheduler {

// Why a sequence ends.
struct Ending {
  Status status;
  engine::FinishReason reason{};
};

class OutputProcessor {
 public:
  void set_observer(engine::EngineObserver observer) { observer_ = std::move(observer); }

  // Feeds one sampled token of `seq` through stop matching and streaming,
  // with its logprobs when the request asked for them (they travel with the
  // token id, and are dropped with it when an EOS or stop token is not
  // returned). Returns how the sequence ends when this token ends it (the
  // caller then frees its blocks and calls Finish); nothing otherwise.
  std::optional<Ending> OnToken(Sequence& seq, int32_t token,
                                const std::optional<engine::TokenLogprob>& logprobs,
                                Clock::time_point now);
  // One batched decode step of `batch` sequences ran.
  void OnDecodeStep(int64_t batch);
  // Reports the end of `seq` to its sink, with its Usage. Exactly once per
  // sequence.
  void Finish(Sequence& seq, const Ending& ending);

 private:
  engine::EngineObserver observer_;
};

}  // namespace snapserve::scheduler
