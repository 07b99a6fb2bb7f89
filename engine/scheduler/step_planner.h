// Schedule(): the scheduling policy as one pure function
// (docs/kv-cache-and-scheduling.md, "Admission and reservation" and "Chunked
// prefill"), unit-tested without a model (tests/unit/scheduler/).
//
//   1. Requests marked `ends` are ended, wherever they are.
//   2. Every decoding sequence decodes one token.
//   3. Waiting requests are admitted FCFS by admission_policy.h (batch room,
//      blocks for the whole reservation, the in-prefill token bound); nobody
//      overtakes the head of the queue.
//   4. Prompt chunks fill max_step_tokens, FCFS over the prompts in prefill
//      (then the ones admitted now); the decode tokens come on top of them.
//      Every prompt is cut at multiples of max_step_tokens from its start
//      (its chunks are the same whatever else runs: batching invariance), so
//      a chunk is max_step_tokens tokens or the prompt's remainder. A step
//      computes at most max_step_tokens prompt tokens + one token per
//      decoding sequence.
#pragma once

#include "engine/scheduler/step_plan.h"

namespace snapserve::scheduler {

StepPlan Schedule(const ScheduleInput& input);

}  // namespace snapserve::scheduler
