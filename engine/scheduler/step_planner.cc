#include "engine/scheduler/step_planner.h"

#include <algorithm>

#include "engine/scheduler/admission_policy.h"

namespace snapserve::scheduler {
namespace {

// Admission over the waiting requests that do not end this step.
std::vector<int64_t> Admit(const ScheduleInput& in, const std::vector<WaitingRequest>& waiting,
                           int64_t admitted_now) {
  if (waiting.empty()) return {};
  int64_t in_prefill = 0;
  for (const PrefillingRequest& p : in.prefilling) {
    if (!p.ends) in_prefill += p.prompt_tokens;
  }
  const int64_t budget = in.limits.max_prefill_tokens - in_prefill;
  // Prompts in prefill use up the bound; the head waits for them rather than
  // stacking prefills (each holds its K/V until its last chunk).
  if (in_prefill > 0 && waiting.front().prompt_tokens > budget) return {};
  std::vector<WaitingCandidate> candidates;
  candidates.reserve(waiting.size());
  for (const WaitingRequest& w : waiting) candidates.push_back({w.reserve_blocks, w.prompt_tokens});
  const AdmissionLimits limits{in.free_blocks, admitted_now, in.limits.max_batch_size, budget};
  const int64_t count = AdmitCount(candidates, limits);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(waiting[static_cast<size_t>(i)].id);
  return ids;
}

// The requests of `requests` that do not end; the ids of those that do are
// appended to `ended`.
template <typename Request>
std::vector<Request> WithoutEnded(const std::vector<Request>& requests,
                                  std::vector<int64_t>& ended) {
  std::vector<Request> kept;
  for (const Request& r : requests) {
    if (r.ends) {
      ended.push_back(r.id);
    } else {
      kept.push_back(r);
    }
  }
  return kept;
}

}  // namespace

StepPlan Schedule(const ScheduleInput& in) {
  StepPlan plan;
  std::vector<WaitingRequest> waiting = WithoutEnded(in.waiting, plan.end);
  std::vector<PrefillingRequest> prefilling = WithoutEnded(in.prefilling, plan.end);
  for (const DecodingRequest& d : WithoutEnded(in.decoding, plan.end)) plan.decode.push_back(d.id);

  const int64_t admitted_now = static_cast<int64_t>(prefilling.size() + plan.decode.size());
  plan.admit = Admit(in, waiting, admitted_now);
  for (size_t i = 0; i < plan.admit.size(); ++i) {
    prefilling.push_back({waiting[i].id, waiting[i].prompt_tokens, waiting[i].prompt_tokens});
  }

  // Prompts are cut at multiples of max_step_tokens from their start, the
  // same cuts whatever else runs, so a prompt's numbers never depend on the
  // load (docs/kv-cache-and-scheduling.md, "Batching invariance").
  // Decode tokens ride on top of the prompt tokens rather than out of them:
  // chunks cannot be cut to fill a remainder (the grid above), so counting
  // 16 decode tokens against a 2048-token budget would leave room for one
  // 1024-token prompt instead of two, doubling the steps that stall every
  // stream (docs/kv-cache-and-scheduling.md, "Chunked prefill").
  const int64_t grid = in.limits.max_step_tokens;
  int64_t allowance = grid;
  for (const PrefillingRequest& p : prefilling) {
    const int64_t tokens = std::min(grid, p.remaining_tokens);
    if (tokens <= 0) continue;
    if (!plan.prefill.empty() && tokens > allowance) break;  // FCFS: no overtaking
    plan.prefill.push_back({p.id, tokens});
    allowance -= tokens;
  }
  return plan;
}

}  // namespace snapserve::scheduler
