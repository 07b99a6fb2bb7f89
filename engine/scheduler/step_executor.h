// StepExecutor: what the scheduler loop needs from whatever runs the steps it
// plans (docs/kv-cache-and-scheduling.md, "The scheduler loop"). The engine
// gives the loop a ModelExecutor (model + paged KV cache, model_executor.h);
// tests/unit/scheduler/ give it a fake that counts blocks and records each
// step, so the loop is tested without a model.
//
// An implementation is the only place where its own failures become a
// Status: Run() never throws, it reports a failed sequence in its outcome.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "engine/common/status.h"
#include "engine/scheduler/sequence.h"
#include "engine/token_logprobs.h"

namespace snapserve::scheduler {

// What a step did for one sequence.
struct StepOutcome {
  Sequence* seq = nullptr;
  // The sampled token: every decoding sequence's, and a prompt's first token
  // when this step ran its last chunk. Empty when the prompt has chunks left.
  std::optional<int32_t> token;
  Status error;  // not OK: the sequence failed (INTERNAL)
  // The token's logprobs, when the request asked for them.
  std::optional<engine::TokenLogprob> logprobs;
};

struct StepResult {
  std::vector<StepOutcome> outcomes;  // decoding sequences first, then prompts
};

// A prompt chunk with its sequence resolved.
struct ChunkWork {
  Sequence* seq = nullptr;
  int64_t tokens = 0;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;

  // Reserves the admitted sequence's blocks (seq.reserve_blocks) and begins its prompt: sets
  // seq.prompt_state, whose done/n() the loop reads to plan the prompt's chunks. Not OK (INTERNAL)
  // when the reservation that admission checked fails after all.
  virtual Status Admit(Sequence& seq) = 0;
  // Frees whatever `seq` holds: its blocks and its prompt state. Called for
  // every sequence that ends, admitted or not.
  virtual void Release(Sequence& seq) = 0;
  // One step: a batched decode of `decode`, then each prompt chunk in order
  // (a prompt's prompt_state advances; it is reset after its last chunk).
  virtual StepResult Run(const std::vector<Sequence*>& decode,
                         const std::vector<ChunkWork>& prefill) = 0;

  // KV blocks, read by admission (free) and for EngineStats. Called on the
  // loop's thread, except total_blocks(), which is fixed and may be read from
  // any thread.
  virtual int64_t free_blocks() const = 0;
  virtual int64_t total_blocks() const = 0;
  virtual double usage_ratio() const = 0;  // reserved blocks / total
  // Share of the prefix cache's memory in use (0 without one).
  virtual double prefix_cache_usage_ratio() const { return 0.0; }

  // A shared prefix-cache tier (model_executor.h). BeginFetch starts looking
  // up a queued sequence's missing prefix chunks off the loop's thread and
  // says whether it did (then it sets seq.fetch_deadline); the loop keeps
  // the sequence from admission until FetchesDone() lists it (its chunks
  // are then in the prefix cache) or the deadline passes. The wakeup lets
  // the executor wake the loop from another thread when a lookup ends; the
  // loop clears it before it goes away.
  virtual bool BeginFetch(Sequence& /*seq*/) { return false; }
  virtual std::vector<int64_t> FetchesDone() { return {}; }
  virtual void SetWakeup(std::function<void()> /*wake*/) {}
};

}  // namespace snapserve::scheduler
