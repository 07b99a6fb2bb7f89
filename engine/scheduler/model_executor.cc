#include "engine/scheduler/model_executor.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <exception>
#include <string>
#include <vector>

#include "engine/compress/adakv_selector.h"
#include "engine/compress/snapkv_selector.h"
#include "engine/compress/streaming_llm_selector.h"
#include "engine/sampling/logprobs.h"

namespace snapserve::scheduler {

ModelExecutor::ModelExecutor(model::LlamaModel& model, kv::PagedKvCache& cache)
    : model_(model), cache_(cache) {}

Status ModelExecutor::Admit(Sequence& seq) {
  const int64_t n = static_cast<int64_t>(seq.prompt.size());
  kv::KvSelector selector;
  int64_t query_rows = 0;  // SnapKV's observation window needs the last w queries
  const engine::KvMethod method = seq.compression.method;
  if (method == engine::KvMethod::kStreamingLlm && compress::ShouldCompress(seq.compression, n)) {
    // No scoring for the selection, nothing worth timing; the window's
    // queries only measure the retained attention
    // (docs/compression-policies.md, "Retained attention").
    seq.retained_attention = std::make_shared<compress::RetainedAttention>();
    selector = compress::MakeStreamingLlmSelector(seq.compression, seq.retained_attention);
    query_rows = compress::StreamingLlmScoreWindow(seq.compression, n);
  } else if (method != engine::KvMethod::kNone && compress::ShouldCompress(seq.compression, n)) {
    // SnapKV, AdaKV and PyramidKV rank SnapKV's scores over the window.
    seq.snapkv_timer = std::make_shared<compress::SelectionTimer>();
    seq.retained_attention = std::make_shared<compress::RetainedAttention>();
    std::vector<int64_t> layer_capacities;  // empty: C in every layer
    if (method == engine::KvMethod::kPyramidKv) {
      layer_capacities =
          compress::PyramidLayerBudgets(seq.compression, n, cache_.config().num_layers);
    }
    selector =
        method == engine::KvMethod::kAdaKv
            ? compress::MakeAdaKvSelector(seq.compression, seq.snapkv_timer, seq.retained_attention)
            : compress::MakeSnapKvSelector(seq.compression, seq.snapkv_timer,
                                           seq.retained_attention, layer_capacities);
    query_rows = seq.compression.window;
  }
  const Status added = cache_.AddSequence(seq.id, seq.reserve_blocks, selector);
  // Admission checked the blocks, so a failure here is an engine fault.
  if (!added.ok()) return Status::Internal("KV reservation failed: " + added.message());
  try {
    seq.prompt_state = model_.BeginPrompt(seq.id, seq.prompt, query_rows);
  } catch (const std::exception& e) {
    cache_.RemoveSequence(seq.id);
    return Status::Internal(std::string("prefill failed: ") + e.what());
  }
  return Status::Ok();
}

void ModelExecutor::Release(Sequence& seq) {
  cache_.RemoveSequence(seq.id);
  seq.prompt_state.reset();
}

StepResult ModelExecutor::Run(const std::vector<Sequence*>& decode,
                              const std::vector<ChunkWork>& prefill) {
  StepResult result;
  c10::InferenceMode inference;
  if (!decode.empty()) Decode(decode, result);
  for (const ChunkWork& chunk : prefill) result.outcomes.push_back(Prefill(chunk));
  return result;
}

void ModelExecutor::Decode(const std::vector<Sequence*>& decode, StepResult& result) {
  std::vector<int64_t> ids;
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<sampling::Sampler*> samplers;
  for (Sequence* seq : decode) {
    ids.push_back(seq->id);
    tokens.push_back(seq->next_token);
    positions.push_back(seq->next_position);
    samplers.push_back(seq->sampler.get());
  }
  try {
    const at::Tensor logits = model_.Decode(ids, tokens, positions, cache_);  // [B, vocab]
    const std::vector<int32_t> sampled = sampling::SampleBatch(logits, samplers);
    // Empty unless some row asked (then one entry per row).
    const auto logprobs = sampling::BatchLogprobs(logits, samplers, sampled);
    for (size_t b = 0; b < decode.size(); ++b) {
      result.outcomes.push_back(
          {decode[b], sampled[b], Status::Ok(), logprobs.empty() ? std::nullopt : logprobs[b]});
    }
  } catch (const std::exception& e) {
    // A fault in the shared step fails the batch; new requests still run.
    const Status failed = Status::Internal(std::string("decode step failed: ") + e.what());
    for (Sequence* seq : decode)
      result.outcomes.push_back({seq, std::nullopt, failed, std::nullopt});
  }
}

StepOutcome ModelExecutor::Prefill(const ChunkWork& chunk) {
  Sequence& seq = *chunk.seq;
  try {
    model::PromptState& st = *seq.prompt_state;
    const at::Tensor h = model_.ContinuePrompt(st, cache_, chunk.tokens);
    if (!st.finished()) return {&seq, std::nullopt, Status::Ok(), std::nullopt};
    const at::Tensor logits = model_.Logits(h.narrow(0, h.size(0) - 1, 1));  // [1, vocab]
    seq.prompt_state.reset();
    seq.kept_entries_total = cache_.total_entries(seq.id);
    seq.kv_bytes_held = cache_.bytes_held(seq.id);
    seq.kv_lanes = cache_.config().num_layers * cache_.config().num_kv_heads;
    sampling::Sampler* samplers[] = {seq.sampler.get()};
    const int32_t token = sampling::SampleBatch(logits, samplers)[0];
    const int32_t sampled[] = {token};
    const auto logprobs = sampling::BatchLogprobs(logits, samplers, sampled);
    return {&seq, token, Status::Ok(), logprobs.empty() ? std::nullopt : logprobs[0]};
  } catch (const std::exception& e) {
    return {&seq, std::nullopt, Status::Internal(std::string("prefill failed: ") + e.what()),
            std::nullopt};
  }
}

}  // namespace snapserve::scheduler
