// Admission: which waiting requests join the running batch this iteration.
// A plain function of numbers (free blocks, batch room, prefill budget) so it
// is unit-tested without a model (modelled on TensorRT-LLM's capacityScheduler).
//
// Policy (docs/kv-cache-and-scheduling.md, "Admission and reservation"): first
// come, first served. Each request reserves, at admission, every block it can
// ever need — min(n, C) prompt entries plus max_new_tokens — so a running
// request never fails for lack of blocks. The head of the queue blocks those
// behind it (no overtaking), so a large request is never starved by a stream of
// small ones. A request that could not fit even in an empty cache is refused
// before it is queued (RESOURCE_EXHAUSTED).
#pragma once

#include <cstdint>
#include <vector>

namespace snapserve::scheduler {

struct AdmissionLimits {
  int64_t free_blocks = 0;
  int64_t running = 0;               // sequences already in the batch
  int64_t max_batch_size = 1;        // most sequences in the batch
  int64_t prefill_token_budget = 0;  // prompt tokens to prefill this iteration
};

struct WaitingCandidate {
  // KV blocks reserved: what min(n, C) + max_new_tokens entries take in
  // every layer and KV head (PagedKvCache::BlocksFor)
  int64_t reserve_blocks = 0;
  int64_t prompt_tokens = 0;  // prefill work
};

// How many requests from the front of `waiting` (in order) to admit now. The
// first candidate ignores the prefill budget (a prompt longer than the budget
// must still run some day); the others must fit in what remains of it.
int64_t AdmitCount(const std::vector<WaitingCandidate>& waiting, const AdmissionLimits& limits);

}  // namespace snapserve::scheduler
