// What one scheduler iteration does, decided by Schedule() (step_planner.h)
// from a description of the queue and the admitted sequences, then carried
// out by a StepExecutor (step_executor.h) and OutputProcessor
// (output_processor.h). Plain data: sequence ids and token counts, no model,
// no tensors (docs/kv-cache-and-scheduling.md, "The scheduler loop").
#pragma once

#include <cstdint>
#include <vector>

namespace snapserve::scheduler {

// The limits a plan respects; the engine fills them from EngineOptions.
struct StepLimits {
  int64_t max_batch_size = 1;  // admitted sequences (prefilling + decoding)
  // Prompt tokens one step computes (one token per decoding sequence comes
  // on top); also the size of the chunks prompts are cut into.
  int64_t max_step_tokens = 1;
  // Prompt tokens admitted into prefill at once (their K/V is held whole
  // until their last chunk); the head of the queue is exempt when no prompt
  // is in prefill.
  int64_t max_prefill_tokens = 1;
};

// The state Schedule() decides over. `ends` marks a cancelled request or one
// whose deadline passed: it is ended wherever it is.
struct WaitingRequest {
  int64_t id = 0;
  int64_t reserve_blocks = 0;  // KV blocks reserved at admission
  int64_t prompt_tokens = 0;
  bool ends = false;
};
struct PrefillingRequest {
  int64_t id = 0;
  int64_t prompt_tokens = 0;
  int64_t remaining_tokens = 0;  // prompt tokens not yet run
  bool ends = false;
};
struct DecodingRequest {
  int64_t id = 0;
  bool ends = false;
};
struct ScheduleInput {
  std::vector<WaitingRequest> waiting;        // FCFS order
  std::vector<PrefillingRequest> prefilling;  // admission order
  std::vector<DecodingRequest> decoding;
  int64_t free_blocks = 0;
  StepLimits limits;
};

// The next `tokens` prompt tokens of sequence `id` run this step.
struct PromptChunk {
  int64_t id = 0;
  int64_t tokens = 0;
};

struct StepPlan {
  std::vector<int64_t> end;          // ended before anything runs, blocks freed
  std::vector<int64_t> admit;        // waiting requests admitted, in order
  std::vector<int64_t> decode;       // one decode token each
  std::vector<PromptChunk> prefill;  // prompt chunks, FCFS (admitted ones last)
  bool idle() const { return decode.empty() && prefill.empty(); }
};

}  // namespace snapserve::scheduler
