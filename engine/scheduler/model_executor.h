// ModelExecutor: runs a step the scheduler planned (step_plan.h) on the model
// and the paged KV cache, which it alone drives, and samples each sequence's
// next token. It is the only place where exceptions from the model, the
// cache or a kernel become a Status (docs/kv-cache-and-scheduling.md, "The
// scheduler loop"): a failed decode step fails the sequences in it, a failed
// prompt chunk fails its prompt, and the engine keeps serving.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/common/status.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama_model.h"
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

class ModelExecutor {
 public:
  ModelExecutor(model::LlamaModel& model, kv::PagedKvCache& cache);

  // Reserves the admitted sequence's blocks, installs its compression selector and
  // begins its prompt. Not OK (INTERNAL) when the reservation that admission
  // checked fails after all.
  Status Admit(Sequence& seq);
  // Frees whatever `seq` holds: its blocks and its prompt state.
  void Release(Sequence& seq);

  // One step: a batched decode of `decode`, then each prompt chunk.
  StepResult Run(const std::vector<Sequence*>& decode, const std::vector<ChunkWork>& prefill);

  const kv::PagedKvCache& cache() const { return cache_; }

 private:
  void Decode(const std::vector<Sequence*>& decode, StepResult& result);
  StepOutcome Prefill(const ChunkWork& chunk);

  model::LlamaModel& model_;
  kv::PagedKvCache& cache_;
};

}  // namespace snapserve::scheduler
