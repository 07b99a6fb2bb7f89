// One request inside the engine: its prompt, its policy (compression,
// sampling, stopping), its streaming state and its timings. Owned by the
// scheduler thread from Submit to Finish; nothing here is shared.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/compress/compression_policy.h"
#include "engine/compress/snapkv_selector.h"
#include "engine/kv/document_cache.h"
#include "engine/model/llama_model.h"
#include "engine/result_sink.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/stop_matcher.h"
#include "engine/tokenizer/tokenizer.h"

namespace snapserve::scheduler {

using Clock = std::chrono::steady_clock;

struct Sequence {
  int64_t id = 0;  // the KV cache's sequence id, unique per engine
  std::string request_id;
  std::vector<int32_t> prompt;
  // A document request (docs/api.md, "Documents and questions"): `prompt` is
  // the document, prefilled and compressed alone; the question's tokens then
  // run one per decode step, their outputs unused, before the first token.
  std::vector<int32_t> question;
  size_t question_fed = 0;  // question tokens given to the model so far
  engine::KvCompressionConfig compression;
  int64_t max_new_tokens = 0;
  int64_t reserve_blocks = 0;  // KV blocks reserved at admission

  std::shared_ptr<engine::ResultSink> sink;
  std::unique_ptr<sampling::Sampler> sampler;
  std::unique_ptr<sampling::StopMatcher> stop;
  std::unique_ptr<tokenizer::IncrementalDecoder> decoder;
  std::shared_ptr<compress::SelectionTimer> snapkv_timer;
  std::shared_ptr<compress::RetainedAttention> retained_attention;  // set when compressed

  Clock::time_point arrival;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point admitted;
  Clock::time_point first_token;
  Clock::time_point last_token;
  // Each prompt chunk's run, for the request's trace (engine::PhaseTimes).
  struct ChunkRun {
    Clock::time_point start;
    Clock::time_point end;
    int64_t tokens = 0;
  };
  std::vector<ChunkRun> chunk_runs;

  // Prefill in progress (admitted, some prompt tokens still to run).
  std::optional<model::PromptState> prompt_state;
  // Decoding state: the token to feed next and its absolute position.
  int32_t next_token = 0;
  int64_t next_position = 0;
  int64_t generated = 0;
  // After prefill: prompt entries cached over every layer and KV head, and
  // the bytes of the blocks holding them.
  int64_t kept_entries_total = 0;
  int64_t kv_bytes_held = 0;
  int64_t kv_lanes = 0;  // layers * KV heads
  // Prompt tokens whose K/V came from the prefix cache (their prefill was
  // skipped), and the chain hashes of the prompt's full chunks.
  int64_t cached_prompt_tokens = 0;
  std::vector<uint64_t> prefix_hashes;
  // A lookup of its missing prefix chunks in the shared tier is under way
  // (StepExecutor::BeginFetch): not admitted until it ends or fetch_deadline.
  bool fetching = false;
  Clock::time_point fetch_deadline;
  // The document's kept entries, captured during its prefill for the
  // document cache; and the cache entry a hit restored instead.
  std::shared_ptr<kv::CompressedDocument> captured_document;
  std::shared_ptr<const kv::CompressedDocument> cached_document;
  bool decoding = false;  // in the decode list (feeding its question or generating)
  bool cancelled = false;
};

}  // namespace snapserve::scheduler
