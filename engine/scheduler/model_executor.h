// ModelExecutor: the engine's StepExecutor (step_executor.h). Runs a step the
// scheduler planned (step_plan.h) on the model and the paged KV cache, which
// it alone drives, and samples each sequence's next token. It is the only place where exceptions
// from the model, the cache or a kernel become a Status (docs/kv-cache-and-scheduling.md, "The
// scheduler loop"): a failed decode step fails the sequences in it, a failed
// prompt chunk fails its prompt, and the engine keeps serving.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/common/status.h"
#include "engine/kv/document_cache.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/kv/prefix_cache.h"
#include "engine/kv/store/shared_kv_tier.h"
#include "engine/model/llama_model.h"
#include "engine/scheduler/sequence.h"
#include "engine/scheduler/step_executor.h"

namespace snapserve::scheduler {

class ModelExecutor final : public StepExecutor {
 public:
  // `prefix` (may be null: no prefix cache) must use chunks that divide the
  // step planner's grid (EngineOptions::max_step_tokens), so that the chunks
  // a prompt runs in are cut on the prefix cache's chunk grid.
  // `tier` (may be null: no shared tier; needs `prefix`) is where chunks
  // missing locally are looked up and chunks computed here are written.
  // `documents` (may be null: no document cache) keeps documents' kept
  // entries for later questions (document_cache.h).
  ModelExecutor(model::LlamaModel& model, kv::PagedKvCache& cache,
                kv::PrefixCache* prefix = nullptr, kv::SharedKvTier* tier = nullptr,
                kv::DocumentCache* documents = nullptr);

  // Reserves the admitted sequence's blocks, installs its compression selector and
  // begins its prompt, from after its longest cached prefix when there is a
  // prefix cache (seq.cached_prompt_tokens). A document found in the document
  // cache is restored into its lanes instead, and no prompt is begun
  // (seq.prompt_state stays empty). Not OK (INTERNAL) when the reservation
  // that admission checked fails after all.
  Status Admit(Sequence& seq) override;
  // Frees whatever `seq` holds: its blocks and its prompt state.
  void Release(Sequence& seq) override;

  // One step: a batched decode of `decode`, then each prompt chunk.
  StepResult Run(const std::vector<Sequence*>& decode,
                 const std::vector<ChunkWork>& prefill) override;

  int64_t free_blocks() const override { return cache_.num_free_blocks(); }
  int64_t total_blocks() const override { return cache_.num_total_blocks(); }
  double usage_ratio() const override { return cache_.usage_ratio(); }
  double prefix_cache_usage_ratio() const override {
    return prefix_ != nullptr ? prefix_->usage_ratio() : 0.0;
  }

  // Looks up the chunks of `seq`'s prompt that the prefix cache lacks (up
  // to the prompt's last token) in the shared tier, waiting at most its
  // fetch_wait; FetchesDone inserts what arrived into the prefix cache.
  bool BeginFetch(Sequence& seq) override;
  std::vector<int64_t> FetchesDone() override;
  void SetWakeup(std::function<void()> wake) override;

 private:
  void Decode(const std::vector<Sequence*>& decode, StepResult& result);
  StepOutcome Prefill(const ChunkWork& chunk);
  // Starts `seq`'s prompt from its longest cached prefix: copies it into the
  // prompt's buffers and marks those tokens done.
  void StartFromCachedPrefix(Sequence& seq, int64_t query_rows);
  // Queues the chunks of `seq` just added to the prefix cache (chunk
  // indices) for writing to the shared tier. A CPU entry is pinned until the
  // writer has read it in place (write_pins_, released in FetchesDone); a
  // device entry is copied to the host.
  void WriteBack(const Sequence& seq, const std::vector<int64_t>& chunks);
  // Fills `seq`'s lanes with a cached document's kept entries.
  Status RestoreDocument(Sequence& seq, std::shared_ptr<const kv::CompressedDocument> doc);

  model::LlamaModel& model_;
  kv::PagedKvCache& cache_;
  kv::PrefixCache* prefix_;
  kv::SharedKvTier* tier_;
  kv::DocumentCache* documents_;
  // Prefix-cache entries the shared tier's writer is reading, by pin number.
  std::unordered_map<uint64_t, kv::PrefixCache::ChunkHandle> write_pins_;
  uint64_t next_write_pin_ = 1;
};

}  // namespace snapserve::scheduler
