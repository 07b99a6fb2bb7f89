#include "engine/scheduler/model_executor.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "engine/compress/adakv_selector.h"
#include "engine/compress/keydiff_selector.h"
#include "engine/compress/snapkv_selector.h"
#include "engine/compress/streaming_llm_selector.h"
#include "engine/sampling/logprobs.h"

namespace snapserve::scheduler {

namespace {

// The paged cache as the model sees it during a prompt's chunks, with each
// layer's K/V of the whole prompt also copied into the prefix cache's pending
// insertion for the sequence (PrefixCache::BeginInsert), if it has one.
class PrefixCapturingStore final : public model::KvStore {
 public:
  PrefixCapturingStore(kv::PagedKvCache& cache, kv::PrefixCache* prefix)
      : cache_(cache), prefix_(prefix) {}
  void StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v) override {
    if (prefix_ != nullptr) prefix_->WriteLayer(seq, layer, k, v);
    cache_.StorePrefillLayer(seq, layer, q, k, v);
  }
  at::Tensor DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v) override {
    return cache_.DecodeAttention(seqs, layer, q, k, v);
  }

 private:
  kv::PagedKvCache& cache_;
  kv::PrefixCache* prefix_;
};

// Every compression setting a document's kept entries depend on: a cached
// document serves only a request whose settings give the same string.
std::string DocumentSettings(const engine::KvCompressionConfig& c) {
  return std::string(engine::kv_method_name(c.method)) + "|C=" + std::to_string(c.capacity) +
         "|w=" + std::to_string(c.window) + "|k=" + std::to_string(c.kernel_size) +
         "|pool=" + engine::kv_pooling_name(c.pooling) + "|sinks=" + std::to_string(c.sink_tokens) +
         "|alpha=" + std::to_string(c.adakv_alpha) + "|beta=" + std::to_string(c.pyramid_beta) +
         "|group=" + std::to_string(static_cast<int>(c.group_reduce));
}

// `inner` (null: keep everything), also copying what it keeps of each layer
// into `doc`.
kv::KvSelector CapturingKept(kv::KvSelector inner, std::shared_ptr<kv::CompressedDocument> doc) {
  return [inner = std::move(inner), doc = std::move(doc)](
             int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    kv::KeptKv kept = inner ? inner(layer, q, k, v) : kv::KeptKv{k, v, {}};
    doc->layers[static_cast<size_t>(layer)] = {kept.k.clone(at::MemoryFormat::Contiguous),
                                               kept.v.clone(at::MemoryFormat::Contiguous),
                                               kept.head_lengths};
    return kept;
  };
}

}  // namespace

ModelExecutor::ModelExecutor(model::LlamaModel& model, kv::PagedKvCache& cache,
                             kv::PrefixCache* prefix, kv::SharedKvTier* tier,
                             kv::DocumentCache* documents)
    : model_(model),
      cache_(cache),
      prefix_(prefix),
      tier_(prefix != nullptr ? tier : nullptr),
      documents_(documents) {}

bool ModelExecutor::BeginFetch(Sequence& seq) {
  if (tier_ == nullptr) return false;
  const int64_t c = prefix_->chunk_tokens();
  const int64_t n = static_cast<int64_t>(seq.prompt.size());
  // The last token always runs (StartFromCachedPrefix); a compressed
  // prompt's window may leave the last chunk fetched here unused.
  const int64_t max_chunks = (n - 1) / c;
  if (max_chunks <= 0) return false;
  seq.prefix_hashes = prefix_->ChainHashes(seq.prompt);
  const int64_t local = prefix_->CachedChunks(seq.prompt, seq.prefix_hashes, max_chunks);
  if (local >= max_chunks) return false;
  std::vector<kv::ChunkRef> missing;
  uint64_t parent = local == 0 ? prefix_->config().fingerprint
                               : seq.prefix_hashes[static_cast<size_t>(local - 1)];
  for (int64_t i = local; i < max_chunks; ++i) {
    const auto first = seq.prompt.begin() + i * c;
    missing.push_back({seq.prefix_hashes[static_cast<size_t>(i)], parent,
                       std::vector<int32_t>(first, first + c)});
    parent = missing.back().hash;
  }
  const auto deadline = Clock::now() + tier_->config().fetch_wait;
  tier_->SubmitFetch(seq.id, std::move(missing), deadline);
  // A little past the tier's own deadline, so a result that arrives just in
  // time is still used.
  seq.fetch_deadline = deadline + std::chrono::milliseconds(50);
  return true;
}

std::vector<int64_t> ModelExecutor::FetchesDone() {
  std::vector<int64_t> done;
  if (tier_ == nullptr) return done;
  c10::InferenceMode inference;
  // Entries the writer no longer reads may be evicted again.
  for (uint64_t pin : tier_->TakeWritten()) write_pins_.erase(pin);
  for (kv::FetchResult& r : tier_->TakeFetched()) {
    for (const kv::FetchedChunk& chunk : r.chunks) {
      if (!prefix_->Insert(chunk.ref.hash, chunk.ref.parent, chunk.ref.tokens, chunk.k, chunk.v))
        break;
    }
    done.push_back(r.owner);
  }
  return done;
}

void ModelExecutor::SetWakeup(std::function<void()> wake) {
  if (tier_ != nullptr) tier_->SetWakeup(std::move(wake));
}

void ModelExecutor::WriteBack(const Sequence& seq, const std::vector<int64_t>& chunks) {
  if (tier_ == nullptr) return;
  const int64_t c = prefix_->chunk_tokens();
  // Last chunk first, so the lookups leave the chain's first chunks the most
  // recently used, as CommitInsert did.
  for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) {
    const auto i = static_cast<size_t>(*it);
    if (!tier_->WriteQueueHasRoom()) {
      tier_->CountDroppedWrite();
      continue;
    }
    std::optional<kv::PrefixCache::ChunkHandle> handle = prefix_->Lookup(seq.prefix_hashes[i]);
    if (!handle.has_value()) continue;
    kv::FetchedChunk chunk;
    chunk.ref.hash = seq.prefix_hashes[i];
    chunk.ref.parent = i == 0 ? prefix_->config().fingerprint : seq.prefix_hashes[i - 1];
    const auto first = seq.prompt.begin() + static_cast<int64_t>(i) * c;
    chunk.ref.tokens.assign(first, first + c);
    if (handle->k().is_cpu() && handle->k().is_contiguous() && handle->v().is_contiguous()) {
      // The writer reads the entry in place; it stays pinned until then.
      chunk.k = handle->k();
      chunk.v = handle->v();
      chunk.pin = next_write_pin_++;
      write_pins_.emplace(chunk.pin, std::move(*handle));
      tier_->SubmitWrite(std::move(chunk));
      continue;
    }
    try {
      chunk.k = handle->k().to(at::kCPU);
      chunk.v = handle->v().to(at::kCPU);
    } catch (const std::exception&) {
      // No memory for the copy: the write is dropped, the request goes on.
      tier_->CountDroppedWrite();
      continue;
    }
    tier_->SubmitWrite(std::move(chunk));
  }
}

void ModelExecutor::StartFromCachedPrefix(Sequence& seq, int64_t query_rows) {
  model::PromptState& st = *seq.prompt_state;
  const int64_t n = st.n();
  const int64_t c = prefix_->chunk_tokens();
  seq.prefix_hashes = prefix_->ChainHashes(seq.prompt);
  // The prompt's last max(1, w) tokens always run: the first token needs the
  // last position's logits, and a selector the last w queries, which the
  // cache does not keep.
  const int64_t max_chunks = (n - std::max<int64_t>(1, query_rows)) / c;
  if (max_chunks <= 0) return;
  const int64_t chunks = prefix_->CachedChunks(seq.prompt, seq.prefix_hashes, max_chunks);
  if (chunks == 0) return;
  // The buffers a prompt in chunks holds (LlamaModel::ContinuePrompt), filled
  // up to the cached prefix as its own earlier chunks would have filled them.
  const model::ModelConfig& mc = model_.config();
  const auto opts = at::TensorOptions().dtype(model_.compute_dtype()).device(model_.device());
  st.keys.resize(static_cast<size_t>(mc.num_layers));
  st.values.resize(static_cast<size_t>(mc.num_layers));
  st.queries.resize(static_cast<size_t>(mc.num_layers));
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    st.keys[static_cast<size_t>(l)] = at::empty({mc.num_kv_heads, n, mc.head_dim}, opts);
    st.values[static_cast<size_t>(l)] = at::empty({mc.num_kv_heads, n, mc.head_dim}, opts);
  }
  prefix_->CopyOut(seq.prefix_hashes, chunks, st.keys, st.values);
  st.done = chunks * c;
  seq.cached_prompt_tokens = st.done;
}

Status ModelExecutor::RestoreDocument(Sequence& seq,
                                      std::shared_ptr<const kv::CompressedDocument> doc) {
  // The cached kept entries go in through the prefill path, as the request
  // that stored them wrote its own: a selector that hands them over.
  const Status added = cache_.AddSequence(
      seq.id, seq.reserve_blocks,
      [doc](int64_t layer, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
        return doc->layers[static_cast<size_t>(layer)];
      });
  if (!added.ok()) return Status::Internal("KV reservation failed: " + added.message());
  try {
    c10::InferenceMode inference;
    const at::Tensor unused;
    for (int64_t l = 0; l < cache_.config().num_layers; ++l) {
      cache_.StorePrefillLayer(seq.id, l, unused, unused, unused);
    }
    cache_.SetSelector(seq.id, nullptr);
  } catch (const std::exception& e) {
    cache_.RemoveSequence(seq.id);
    return Status::Internal(std::string("document restore failed: ") + e.what());
  }
  seq.cached_prompt_tokens = static_cast<int64_t>(seq.prompt.size());
  seq.kept_entries_total = cache_.total_entries(seq.id);
  seq.kv_bytes_held = cache_.bytes_held(seq.id);
  seq.kv_lanes = cache_.config().num_layers * cache_.config().num_kv_heads;
  seq.cached_document = std::move(doc);
  return Status::Ok();
}

Status ModelExecutor::Admit(Sequence& seq) {
  const bool document = documents_ != nullptr && !seq.question.empty();
  if (document) {
    auto doc = documents_->Lookup(seq.prompt, DocumentSettings(seq.compression));
    if (doc != nullptr) return RestoreDocument(seq, std::move(doc));
  }
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
  } else if (method == engine::KvMethod::kKeyDiff && compress::ShouldCompress(seq.compression, n)) {
    // KeyDiff scores keys alone; the window's queries only measure the
    // retained attention.
    seq.retained_attention = std::make_shared<compress::RetainedAttention>();
    selector = compress::MakeKeyDiffSelector(seq.compression, seq.retained_attention);
    query_rows = compress::KeyDiffScoreWindow(seq.compression, n);
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
  if (document) {
    seq.captured_document = std::make_shared<kv::CompressedDocument>();
    seq.captured_document->tokens = seq.prompt;
    seq.captured_document->settings = DocumentSettings(seq.compression);
    seq.captured_document->layers.resize(static_cast<size_t>(cache_.config().num_layers));
    seq.captured_document->compressed = seq.retained_attention != nullptr;
    selector = CapturingKept(std::move(selector), seq.captured_document);
  }
  const Status added = cache_.AddSequence(seq.id, seq.reserve_blocks, selector);
  // Admission checked the blocks, so a failure here is an engine fault.
  if (!added.ok()) return Status::Internal("KV reservation failed: " + added.message());
  try {
    seq.prompt_state = model_.BeginPrompt(seq.id, seq.prompt, query_rows);
    if (prefix_ != nullptr) {
      c10::InferenceMode inference;
      StartFromCachedPrefix(seq, query_rows);
    }
  } catch (const std::exception& e) {
    cache_.RemoveSequence(seq.id);
    return Status::Internal(std::string("prefill failed: ") + e.what());
  }
  return Status::Ok();
}

void ModelExecutor::Release(Sequence& seq) {
  cache_.RemoveSequence(seq.id);
  if (prefix_ != nullptr) prefix_->AbortInsert(seq.id);
  seq.prompt_state.reset();
}

StepResult ModelExecutor::Run(const std::vector<Sequence*>& decode,
                              const std::vector<ChunkWork>& prefill) {
  StepResult result;
  c10::InferenceMode inference;
  if (!decode.empty()) Decode(decode, result);
  for (const ChunkWork& chunk : prefill) {
    const Clock::time_point start = Clock::now();
    result.outcomes.push_back(Prefill(chunk));
    chunk.seq->chunk_runs.push_back({start, Clock::now(), chunk.tokens});
  }
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
      Sequence& seq = *decode[b];
      if (!seq.question.empty() && seq.generated == 0 && seq.question_fed == seq.question.size()) {
        // The question's last token is in: what the request holds now.
        seq.kept_entries_total = cache_.total_entries(seq.id);
        seq.kv_bytes_held = cache_.bytes_held(seq.id);
      }
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
    PrefixCapturingStore store(cache_, prefix_);
    at::Tensor h;
    // With a prefix cache the chunk runs in pieces cut on the cache's chunk
    // grid, so a prompt computes the same numbers whether its prefix came
    // from the cache or ran here: a piece depends only on its tokens and the
    // K/V before it (docs/kv-cache-and-scheduling.md, "Prefix cache").
    for (int64_t left = chunk.tokens; left > 0 && !st.finished();) {
      int64_t piece = left;
      if (prefix_ != nullptr) {
        piece = std::min(left, prefix_->chunk_tokens() - st.done % prefix_->chunk_tokens());
      }
      // A document is kept compressed in the document cache instead.
      if (prefix_ != nullptr && seq.captured_document == nullptr && st.done + piece >= st.n()) {
        prefix_->BeginInsert(seq.id, seq.prompt, seq.prefix_hashes);
      }
      h = model_.ContinuePrompt(st, store, piece);
      left -= piece;
    }
    if (!st.finished()) return {&seq, std::nullopt, Status::Ok(), std::nullopt};
    if (prefix_ != nullptr) WriteBack(seq, prefix_->CommitInsert(seq.id));
    seq.prompt_state.reset();
    seq.kept_entries_total = cache_.total_entries(seq.id);
    seq.kv_bytes_held = cache_.bytes_held(seq.id);
    seq.kv_lanes = cache_.config().num_layers * cache_.config().num_kv_heads;
    if (seq.captured_document != nullptr) {
      if (seq.retained_attention) {
        seq.captured_document->retained_attention = seq.retained_attention->Mean();
      }
      documents_->Insert(std::move(*seq.captured_document));
      seq.captured_document.reset();
    }
    if (!seq.question.empty()) {
      // Nothing is sampled after a document: its question comes next, and a
      // sampler's random state must advance as on a document cache hit.
      return {&seq, seq.question.front(), Status::Ok(), std::nullopt};
    }
    const at::Tensor logits = model_.Logits(h.narrow(0, h.size(0) - 1, 1));  // [1, vocab]
    sampling::Sampler* samplers[] = {seq.sampler.get()};
    const int32_t token = sampling::SampleBatch(logits, samplers)[0];
    const int32_t sampled[] = {token};
    const auto logprobs = sampling::BatchLogprobs(logits, samplers, sampled);
    return {&seq, token, Status::Ok(), logprobs.empty() ? std::nullopt : logprobs[0]};
  } catch (const std::exception& e) {
    if (prefix_ != nullptr) prefix_->AbortInsert(seq.id);
    return {&seq, std::nullopt, Status::Internal(std::string("prefill failed: ") + e.what()),
            std::nullopt};
  }
}

}  // namespace snapserve::scheduler
