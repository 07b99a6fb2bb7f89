#include "engine/scheduler/scheduler.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <exception>
#include <limits>

#include "engine/scheduler/admission_policy.h"

namespace snapserve::scheduler {
namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

Scheduler::Scheduler(model::LlamaModel& model, kv::PagedKvCache& cache,
                     const tokenizer::Tokenizer& tokenizer, SchedulerOptions options)
    : model_(model), cache_(cache), tokenizer_(tokenizer), options_(options) {
  PublishStats();
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() { Shutdown(); }

Status Scheduler::Submit(std::unique_ptr<Sequence> seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Unavailable("engine is shutting down");
    if (queued_.load() >= options_.max_queue) {
      return Status::ResourceExhausted("waiting queue is full (" +
                                       std::to_string(options_.max_queue) + " requests)");
    }
    ++queued_;
    inbox_.push_back(std::move(seq));
  }
  wake_.notify_one();
  return Status::Ok();
}

void Scheduler::Cancel(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.insert(request_id);
  }
  wake_.notify_one();
}

void Scheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

engine::EngineStats Scheduler::Stats() const {
  engine::EngineStats s;
  s.running = running_count_.load();
  s.waiting = queued_.load();
  s.kv_blocks_free = free_blocks_.load();
  s.kv_blocks_total = cache_.num_total_blocks();
  s.kv_usage_ratio = usage_ratio_.load();
  return s;
}

void Scheduler::SetObserver(engine::EngineObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(observer);
}

void Scheduler::PublishStats() {
  // Admitted requests, whether still in prefill or decoding.
  running_count_.store(static_cast<int64_t>(running_.size() + prefilling_.size()));
  free_blocks_.store(cache_.num_free_blocks());
  usage_ratio_.store(cache_.usage_ratio());
}

void Scheduler::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Sleep only when there is nothing to do at all.
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || !running_.empty() ||
               !prefilling_.empty() || !waiting_.empty();
      });
      if (stopping_) break;
    }
    TakeInbox();
    EndCancelledAndExpired(Clock::now());
    Admit();
    AdvancePrefills();
    DecodeStep();
    PublishStats();
    if (running_.empty() && prefilling_.empty() && !waiting_.empty()) {
      // Waiting requests that cannot be admitted with nothing running can only
      // be waiting for cancellations; avoid spinning.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  // Shutdown: everything still here ends with UNAVAILABLE.
  TakeInbox();
  for (auto& seq : running_) Finish(*seq, Status::Unavailable("engine shut down"), {});
  for (auto& seq : prefilling_) Finish(*seq, Status::Unavailable("engine shut down"), {});
  for (auto& seq : waiting_) Finish(*seq, Status::Unavailable("engine shut down"), {});
  running_.clear();
  prefilling_.clear();
  waiting_.clear();
  PublishStats();
}

void Scheduler::TakeInbox() {
  std::unordered_set<std::string> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!inbox_.empty()) {
      waiting_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    cancels.swap(cancels_);
  }
  if (cancels.empty()) return;
  for (auto& seq : waiting_) seq->cancelled |= cancels.contains(seq->request_id);
  for (auto& seq : prefilling_) seq->cancelled |= cancels.contains(seq->request_id);
  for (auto& seq : running_) seq->cancelled |= cancels.contains(seq->request_id);
}

void Scheduler::EndCancelledAndExpired(Clock::time_point now) {
  auto end_if_done = [&](std::unique_ptr<Sequence>& seq) {
    if (seq->cancelled) {
      Finish(*seq, Status::Cancelled("request cancelled"), {});
    } else if (now >= seq->deadline) {
      Finish(*seq,
             Status::DeadlineExceeded("deadline passed after " + std::to_string(seq->generated) +
                                      " tokens"),
             {});
    } else {
      return false;
    }
    return true;
  };
  std::erase_if(running_, end_if_done);
  std::erase_if(prefilling_, end_if_done);
  std::erase_if(waiting_, end_if_done);
}

void Scheduler::Admit() {
  if (waiting_.empty()) return;
  // Prompts already in prefill use up the per-iteration budget; the head of
  // the queue waits for them rather than stacking prefills (each holds its
  // [n, hidden] residual stream until done).
  int64_t prefill_tokens = 0;
  for (const auto& seq : prefilling_) prefill_tokens += seq->prefill->n;
  const int64_t budget = options_.max_prefill_tokens_per_step - prefill_tokens;
  if (!prefilling_.empty() && static_cast<int64_t>(waiting_.front()->prompt.size()) > budget) {
    return;
  }
  std::vector<WaitingCandidate> candidates;
  candidates.reserve(waiting_.size());
  for (const auto& seq : waiting_) {
    candidates.push_back({seq->reserve_tokens, static_cast<int64_t>(seq->prompt.size())});
  }
  const AdmissionLimits limits{cache_.num_free_blocks(), cache_.block_size(),
                               static_cast<int64_t>(running_.size() + prefilling_.size()),
                               options_.max_batch_size, budget};
  const int64_t admit = AdmitCount(candidates, limits);
  for (int64_t i = 0; i < admit; ++i) {
    std::unique_ptr<Sequence> seq = std::move(waiting_.front());
    waiting_.pop_front();
    StartPrefill(std::move(seq));
  }
}

void Scheduler::StartPrefill(std::unique_ptr<Sequence> seq) {
  --queued_;
  seq->admitted = Clock::now();
  const int64_t n = static_cast<int64_t>(seq->prompt.size());
  kv::KvSelector selector;
  if (compress::ShouldCompress(seq->compression, n)) {
    seq->snapkv_timer = std::make_shared<compress::SelectionTimer>();
    selector = compress::MakeSnapKvSelector(seq->compression, seq->snapkv_timer);
  }
  Status added = cache_.AddSequence(seq->id, seq->reserve_tokens, selector);
  if (!added.ok()) {
    // Admission checked the blocks, so this is an engine fault.
    Finish(*seq, Status::Internal("KV reservation failed: " + added.message()), {});
    return;
  }
  try {
    c10::InferenceMode inference;
    seq->prefill = model_.BeginPrefill(seq->id, seq->prompt);
  } catch (const std::exception& e) {
    Finish(*seq, Status::Internal(std::string("prefill failed: ") + e.what()), {});
    return;
  }
  prefilling_.push_back(std::move(seq));
}

void Scheduler::AdvancePrefills() {
  if (prefilling_.empty()) return;
  const int64_t layers_total = model_.config().num_layers;
  // With nobody decoding there is nobody to keep waiting: run prompts whole.
  const bool sliced = options_.prefill_chunk_tokens > 0 && !running_.empty();
  int64_t budget = sliced ? options_.prefill_chunk_tokens * layers_total
                          : std::numeric_limits<int64_t>::max();  // token-layers
  std::vector<std::unique_ptr<Sequence>> still_prefilling;
  for (auto& seq : prefilling_) {
    model::PrefillState& st = *seq->prefill;
    if (budget <= 0) {
      still_prefilling.push_back(std::move(seq));
      continue;
    }
    const int64_t layers =
        sliced ? std::clamp<int64_t>(budget / st.n, 1, layers_total) : layers_total;
    budget = sliced ? budget - layers * st.n : budget;
    bool done = false;
    try {
      c10::InferenceMode inference;
      done = model_.ContinuePrefill(st, cache_, layers);
    } catch (const std::exception& e) {
      Finish(*seq, Status::Internal(std::string("prefill failed: ") + e.what()), {});
      continue;
    }
    if (done) {
      FinishPrefill(std::move(seq));
    } else {
      still_prefilling.push_back(std::move(seq));
    }
  }
  prefilling_.swap(still_prefilling);
}

void Scheduler::FinishPrefill(std::unique_ptr<Sequence> seq) {
  int32_t token = 0;
  try {
    c10::InferenceMode inference;
    const at::Tensor logits = model_.PrefillLogits(*seq->prefill);  // [vocab]
    seq->prefill.reset();
    seq->kept_entries = cache_.num_tokens(seq->id);
    sampling::Sampler* samplers[] = {seq->sampler.get()};
    token = sampling::SampleBatch(logits.unsqueeze(0), samplers)[0];
  } catch (const std::exception& e) {
    Finish(*seq, Status::Internal(std::string("prefill failed: ") + e.what()), {});
    return;
  }
  seq->next_position = static_cast<int64_t>(seq->prompt.size());
  bool finished = false;
  HandleToken(*seq, token, Clock::now(), &finished);
  if (!finished) running_.push_back(std::move(seq));
}

void Scheduler::DecodeStep() {
  if (running_.empty()) return;
  std::vector<int64_t> ids;
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<sampling::Sampler*> samplers;
  for (const auto& seq : running_) {
    ids.push_back(seq->id);
    tokens.push_back(seq->next_token);
    positions.push_back(seq->next_position);
    samplers.push_back(seq->sampler.get());
  }
  std::vector<int32_t> sampled;
  try {
    c10::InferenceMode inference;
    const at::Tensor logits = model_.Decode(ids, tokens, positions, cache_);  // [B, vocab]
    sampled = sampling::SampleBatch(logits, samplers);
  } catch (const std::exception& e) {
    // A fault in the shared step: fail this batch, keep serving new requests.
    for (auto& seq : running_) {
      Finish(*seq, Status::Internal(std::string("decode step failed: ") + e.what()), {});
    }
    running_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (observer_.on_decode_step) observer_.on_decode_step(static_cast<int64_t>(ids.size()));
  }
  const Clock::time_point now = Clock::now();
  std::vector<std::unique_ptr<Sequence>> still_running;
  still_running.reserve(running_.size());
  for (size_t b = 0; b < running_.size(); ++b) {
    Sequence& seq = *running_[b];
    ++seq.next_position;
    bool finished = false;
    HandleToken(seq, sampled[b], now, &finished);
    if (!finished) still_running.push_back(std::move(running_[b]));
  }
  running_.swap(still_running);
}

void Scheduler::HandleToken(Sequence& seq, int32_t token, Clock::time_point now, bool* finished) {
  if (seq.generated == 0) {
    seq.first_token = now;
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    if (observer_.on_inter_token_latency) {
      observer_.on_inter_token_latency(std::chrono::duration<double>(now - seq.last_token).count());
    }
  }
  seq.last_token = now;
  ++seq.generated;
  seq.sampler->Accept(token);
  seq.next_token = token;

  const std::optional<engine::FinishReason> end = seq.stop->OnToken(token);
  std::vector<uint32_t> ids;
  std::string text;
  bool stopped_on_text = false;
  if (end == engine::FinishReason::kEos || end == engine::FinishReason::kStopToken) {
    // The stopping token itself is not part of the output.
    text = seq.stop->OnText(seq.decoder->Flush()).emit + seq.stop->Flush();
  } else {
    ids.push_back(static_cast<uint32_t>(token));
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
  if (!ids.empty() || !text.empty()) seq.sink->OnDelta(ids, text);
  if (stopped_on_text) {
    Finish(seq, Status::Ok(), engine::FinishReason::kStopSequence);
  } else if (end.has_value()) {
    Finish(seq, Status::Ok(), *end);
  } else {
    *finished = false;
    return;
  }
  *finished = true;
}

void Scheduler::Finish(Sequence& seq, const Status& status, engine::FinishReason reason) {
  cache_.RemoveSequence(seq.id);
  const Clock::time_point now = Clock::now();
  engine::Usage u;
  u.prompt_tokens = static_cast<uint32_t>(seq.prompt.size());
  // EOS and stop tokens are generated but not returned; count what was returned.
  u.completion_tokens = static_cast<uint32_t>(
      seq.generated -
      ((reason == engine::FinishReason::kEos || reason == engine::FinishReason::kStopToken) ? 1
                                                                                            : 0));
  u.kv_prompt_entries = static_cast<uint32_t>(seq.prompt.size());
  u.kv_kept_entries = static_cast<uint32_t>(seq.kept_entries);
  u.compression_ratio =
      seq.kept_entries > 0 ? static_cast<float>(seq.prompt.size()) / seq.kept_entries : 1.f;
  const bool admitted = seq.admitted != Clock::time_point{};
  if (!admitted) --queued_;
  u.queue_ms = Ms((admitted ? seq.admitted : now) - seq.arrival);
  u.time_to_first_token_ms = seq.generated > 0 ? Ms(seq.first_token - seq.arrival) : 0;
  u.total_ms = Ms(now - seq.arrival);
  u.snapkv_ms = seq.snapkv_timer ? seq.snapkv_timer->seconds * 1e3 : -1;
  seq.sink->OnFinish(status, reason, u);
}

}  // namespace snapserve::scheduler
