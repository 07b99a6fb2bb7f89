#include "engine/scheduler/output_processor.h"

#include <chrono>
#include <string>
#include <vector>

namespace snapserve::scheduler {
namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The steady clock's instants as Unix-epoch nanoseconds, from one reading of
// both clocks: the phases keep their exact spacing whatever the wall clock does.
class EpochNanos {
 public:
  explicit EpochNanos(Clock::time_point now)
      : steady_(now),
        epoch_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()) {}
  int64_t operator()(Clock::time_point t) const {
    if (t == Clock::time_point{}) return 0;
    return epoch_ns_ - std::chrono::duration_cast<std::chrono::nanoseconds>(steady_ - t).count();
  }

 private:
  Clock::time_point steady_;
  int64_t epoch_ns_;
};

engine::PhaseTimes Phases(const Sequence& seq, Clock::time_point now) {
  const EpochNanos ns(now);
  engine::PhaseTimes p;
  p.arrival_ns = ns(seq.arrival);
  p.admitted_ns = ns(seq.admitted);
  p.first_token_ns = seq.generated > 0 ? ns(seq.first_token) : 0;
  p.end_ns = ns(now);
  p.prompt_chunks.reserve(seq.chunk_runs.size());
  for (const Sequence::ChunkRun& c : seq.chunk_runs) {
    p.prompt_chunks.push_back({ns(c.start), ns(c.end), c.tokens});
  }
  return p;
}

}  // namespace

void OutputProcessor::OnDecodeStep(int64_t batch) {
  if (observer_.on_decode_step) observer_.on_decode_step(batch);
}

std::optional<Ending> OutputProcessor::OnToken(Sequence& seq, int32_t token,
                                               const std::optional<engine::TokenLogprob>& logprobs,
                                               Clock::time_point now) {
  if (seq.generated == 0) {
    seq.first_token = now;
  } else if (observer_.on_inter_token_latency) {
    observer_.on_inter_token_latency(std::chrono::duration<double>(now - seq.last_token).count());
  }
  seq.last_token = now;
  ++seq.generated;
  seq.sampler->Accept(token);
  seq.next_token = token;

  const std::optional<engine::FinishReason> end = seq.stop->OnToken(token);
  std::vector<uint32_t> ids;
  std::vector<engine::TokenLogprob> id_logprobs;  // aligned with `ids`
  std::string text;
  bool stopped_on_text = false;
  if (end == engine::FinishReason::kEos || end == engine::FinishReason::kStopToken) {
    // The stopping token itself is not part of the output.
    text = seq.stop->OnText(seq.decoder->Flush()).emit + seq.stop->Flush();
  } else {
    ids.push_back(static_cast<uint32_t>(token));
    // A token whose text completes a stop sequence is still returned (its id,
    // not its text), so its logprobs are too.
    if (logprobs.has_value()) id_logprobs.push_back(*logprobs);
    const auto r = seq.stop->OnText(seq.decoder->Push(token));
    text = r.emit;
    stopped_on_text = r.stopped;
    if (!stopped_on_text && end == engine::FinishReason::kLength) {
      const auto tail = seq.stop->OnText(seq.decoder->Flush());
      text += tail.emit;
      stopped_on_text = tail.stopped;
      if (!stopped_on_text) text += seq.stop->Flush();
    }
  }
  if (!ids.empty() || !text.empty()) seq.sink->OnDelta(ids, text, id_logprobs);
  if (stopped_on_text) return Ending{Status::Ok(), engine::FinishReason::kStopSequence};
  if (end.has_value()) return Ending{Status::Ok(), *end};
  return std::nullopt;
}

void OutputProcessor::Finish(Sequence& seq, const Ending& ending) {
  const Clock::time_point now = Clock::now();
  const engine::FinishReason reason = ending.reason;
  engine::Usage u;
  // A document's question counts as prompt: the model read it before answering.
  const size_t prompt_tokens = seq.prompt.size() + seq.question.size();
  u.prompt_tokens = static_cast<uint32_t>(prompt_tokens);
  u.cached_prompt_tokens = static_cast<uint32_t>(seq.cached_prompt_tokens);
  u.document_cache_hit = seq.cached_document != nullptr;
  // EOS and stop tokens are generated but not returned; count what was returned.
  const bool stop_token =
      reason == engine::FinishReason::kEos || reason == engine::FinishReason::kStopToken;
  u.completion_tokens = static_cast<uint32_t>(seq.generated - (ending.status.ok() && stop_token));
  u.kv_prompt_entries = static_cast<uint32_t>(prompt_tokens);
  // kv_kept_entries: the mean per (layer, KV head) lane, rounded down.
  u.kv_kept_entries_total = static_cast<uint64_t>(seq.kept_entries_total);
  u.kv_bytes_held = static_cast<uint64_t>(seq.kv_bytes_held);
  if (seq.kept_entries_total > 0 && seq.kv_lanes > 0) {
    u.kv_kept_entries = static_cast<uint32_t>(seq.kept_entries_total / seq.kv_lanes);
    u.compression_ratio =
        static_cast<float>(static_cast<double>(prompt_tokens) * static_cast<double>(seq.kv_lanes) /
                           static_cast<double>(seq.kept_entries_total));
  } else {
    u.compression_ratio = 1.f;
  }
  const bool admitted = seq.admitted != Clock::time_point{};
  u.queue_ms = Ms((admitted ? seq.admitted : now) - seq.arrival);
  u.time_to_first_token_ms = seq.generated > 0 ? Ms(seq.first_token - seq.arrival) : 0;
  u.total_ms = Ms(now - seq.arrival);
  u.snapkv_ms = seq.snapkv_timer ? seq.snapkv_timer->seconds * 1e3 : -1;
  // Set at admission when a selector was installed; Mean() is -1 until a layer ran.
  if (seq.retained_attention) {
    u.kv_method = seq.compression.method;
    u.retained_attention = seq.retained_attention->Mean();
  } else if (seq.cached_document != nullptr && seq.cached_document->compressed) {
    // Restored from the document cache: what the request that stored it measured.
    u.kv_method = seq.compression.method;
    u.retained_attention = seq.cached_document->retained_attention;
  }
  u.phases = Phases(seq, now);
  seq.sink->OnFinish(ending.status, reason, u);
}

}  // namespace snapserve::scheduler
