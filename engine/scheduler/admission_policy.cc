#include "engine/scheduler/admission_policy.h"

namespace snapserve::scheduler {

int64_t AdmitCount(const std::vector<WaitingCandidate>& waiting, const AdmissionLimits& limits) {
  int64_t admitted = 0;
  int64_t blocks = limits.free_blocks;
  int64_t budget = limits.prefill_token_budget;
  for (const WaitingCandidate& c : waiting) {
    if (limits.running + admitted >= limits.max_batch_size) break;
    const int64_t need = c.reserve_blocks;
    if (need > blocks) break;  // head-of-line: nobody overtakes
    if (admitted > 0 && c.prompt_tokens > budget) break;
    blocks -= need;
    budget -= c.prompt_tokens;
    ++admitted;
  }
  return admitted;
}

}  // namespace snapserve::scheduler
