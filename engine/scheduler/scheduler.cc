#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/common/idle_memory.h"
#include "engine/scheduler/step_planner.h"

namespace snapserve::scheduler {

namespace {

// How long the loop stays idle before it returns the freed heap to the system.
constexpr std::chrono::seconds kIdleBeforeTrim{1};

// Takes the sequence with `id` out of `seqs` (nullptr when absent).
template <typename Container>
std::unique_ptr<Sequence> TakeById(Container& seqs, int64_t id) {
  auto it = std::find_if(seqs.begin(), seqs.end(), [&](const auto& s) { return s->id == id; });
  if (it == seqs.end()) return nullptr;
  std::unique_ptr<Sequence> seq = std::move(*it);
  seqs.erase(it);
  return seq;
}

template <typename Container>
Sequence* FindById(Container& seqs, int64_t id) {
  auto it = std::find_if(seqs.begin(), seqs.end(), [&](const auto& s) { return s->id == id; });
  return it == seqs.end() ? nullptr : it->get();
}

}  // namespace

Scheduler::Scheduler(std::unique_ptr<StepExecutor> executor, SchedulerOptions options)
    : options_(options), executor_(std::move(executor)) {
  executor_->SetWakeup([this] { wake_.notify_one(); });
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
  executor_->SetWakeup({});
}

engine::EngineStats Scheduler::Stats() const {
  engine::EngineStats s;
  s.running = running_count_.load();
  s.waiting = queued_.load();
  s.kv_blocks_free = free_blocks_.load();
  s.kv_blocks_total = executor_->total_blocks();
  s.kv_usage_ratio = usage_ratio_.load();
  s.prefix_cache_usage_ratio = prefix_cache_usage_ratio_.load();
  return s;
}

void Scheduler::SetObserver(engine::EngineObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(observer);
}

void Scheduler::PublishStats() {
  // Admitted requests, whether still in prefill or decoding.
  running_count_.store(static_cast<int64_t>(decoding_.size() + prefilling_.size()));
  free_blocks_.store(executor_->free_blocks());
  usage_ratio_.store(executor_->usage_ratio());
  prefix_cache_usage_ratio_.store(executor_->prefix_cache_usage_ratio());
}

void Scheduler::Loop() {
  // Whether the heap was handed back since the last step that did work
  // (engine/common/idle_memory.h); nothing to give back before the first.
  bool trimmed = true;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto has_work = [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || !decoding_.empty() ||
               !prefilling_.empty() || !waiting_.empty();
      };
      // Idle for kIdleBeforeTrim: give the freed heap back, once. Not at the
      // instant the last request ends, so back-to-back requests of one
      // client do not pay fresh page faults each.
      if (!trimmed && !wake_.wait_for(lock, kIdleBeforeTrim, has_work)) {
        lock.unlock();
        ReturnFreedHeapToSystem();
        trimmed = true;
        lock.lock();
      }
      // Sleep only when there is nothing to do at all.
      wake_.wait(lock, has_work);
      if (stopping_) break;
      output_.set_observer(observer_);  // called below without the lock
    }
    trimmed = false;
    TakeInbox();
    EndFetches();
    const StepPlan plan = Schedule(DescribeState(Clock::now()));
    Apply(plan);
    PublishStats();
    if (plan.idle() && !waiting_.empty()) {
      // Waiting requests that cannot be admitted with nothing running can only
      // be waiting for cancellations; avoid spinning.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  // Shutdown: everything still here ends with UNAVAILABLE.
  TakeInbox();
  const Ending shut_down{Status::Unavailable("engine shut down"), {}};
  for (auto* seqs : {&decoding_, &prefilling_}) {
    for (auto& seq : *seqs) Finish(std::move(seq), shut_down);
    seqs->clear();
  }
  for (auto& seq : waiting_) Finish(std::move(seq), shut_down);
  waiting_.clear();
  PublishStats();
}

void Scheduler::TakeInbox() {
  std::unordered_set<std::string> cancels;
  const size_t known = waiting_.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!inbox_.empty()) {
      waiting_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    cancels.swap(cancels_);
  }
  for (size_t i = known; i < waiting_.size(); ++i) {
    waiting_[i]->fetching = executor_->BeginFetch(*waiting_[i]);
  }
  if (cancels.empty()) return;
  for (auto& seq : waiting_) seq->cancelled |= cancels.contains(seq->request_id);
  for (auto& seq : prefilling_) seq->cancelled |= cancels.contains(seq->request_id);
  for (auto& seq : decoding_) seq->cancelled |= cancels.contains(seq->request_id);
}

void Scheduler::EndFetches() {
  for (int64_t id : executor_->FetchesDone()) {
    if (Sequence* s = FindById(waiting_, id)) s->fetching = false;
  }
  // A lookup that outlives its wait no longer holds its request back.
  const Clock::time_point now = Clock::now();
  for (auto& s : waiting_) s->fetching = s->fetching && now < s->fetch_deadline;
}

ScheduleInput Scheduler::DescribeState(Clock::time_point now) const {
  auto ends = [&](const Sequence& s) { return s.cancelled || now >= s.deadline; };
  ScheduleInput in;
  for (const auto& s : waiting_) {
    if (s->fetching && !ends(*s)) continue;  // its chunks are on their way
    in.waiting.push_back(
        {s->id, s->reserve_blocks, static_cast<int64_t>(s->prompt.size()), ends(*s)});
  }
  for (const auto& s : prefilling_) {
    const model::PromptState& st = *s->prompt_state;
    in.prefilling.push_back({s->id, st.n(), st.n() - st.done, ends(*s)});
  }
  for (const auto& s : decoding_) in.decoding.push_back({s->id, ends(*s)});
  in.free_blocks = executor_->free_blocks();
  in.limits = options_.limits;
  return in;
}

void Scheduler::Apply(const StepPlan& plan) {
  for (int64_t id : plan.end) EndRequest(id);
  for (int64_t id : plan.admit) Admit(id);
  RunStep(plan);
}

void Scheduler::EndRequest(int64_t id) {
  std::unique_ptr<Sequence> seq = TakeById(waiting_, id);
  if (!seq) seq = TakeById(prefilling_, id);
  if (!seq) seq = TakeById(decoding_, id);
  if (!seq) return;
  if (seq->cancelled) {
    Finish(std::move(seq), {Status::Cancelled("request cancelled"), {}});
  } else {
    const std::string generated = std::to_string(seq->generated);
    Finish(std::move(seq),
           {Status::DeadlineExceeded("deadline passed after " + generated + " tokens"), {}});
  }
}

void Scheduler::Admit(int64_t id) {
  std::unique_ptr<Sequence> seq = TakeById(waiting_, id);
  if (!seq) return;
  --queued_;
  seq->admitted = Clock::now();
  const Status admitted = executor_->Admit(*seq);
  if (!admitted.ok()) {
    Finish(std::move(seq), {admitted, {}});
    return;
  }
  if (!seq->prompt_state.has_value()) {
    // A document restored from the document cache: no prompt left to run,
    // its question goes next.
    seq->next_position = static_cast<int64_t>(seq->prompt.size());
    seq->next_token = seq->question[seq->question_fed++];
    seq->decoding = true;
    decoding_.push_back(std::move(seq));
    return;
  }
  prefilling_.push_back(std::move(seq));
}

void Scheduler::RunStep(const StepPlan& plan) {
  std::vector<Sequence*> decode;
  for (int64_t id : plan.decode) {
    if (Sequence* s = FindById(decoding_, id)) decode.push_back(s);
  }
  std::vector<ChunkWork> prefill;
  for (const PromptChunk& c : plan.prefill) {
    // A prompt admitted now whose admission failed is gone already.
    if (Sequence* s = FindById(prefilling_, c.id)) prefill.push_back({s, c.tokens});
  }
  if (decode.empty() && prefill.empty()) return;
  const StepResult result = executor_->Run(decode, prefill);
  if (!decode.empty()) output_.OnDecodeStep(static_cast<int64_t>(decode.size()));

  const Clock::time_point now = Clock::now();
  for (const StepOutcome& o : result.outcomes) {
    Sequence& seq = *o.seq;
    const bool was_decoding = seq.decoding;  // else a prompt's last chunk ran now
    auto take = [&] {
      return was_decoding ? TakeById(decoding_, seq.id) : TakeById(prefilling_, seq.id);
    };
    auto start_decoding = [&] {
      seq.decoding = true;
      decoding_.push_back(take());
    };
    if (!o.error.ok()) {
      Finish(take(), {o.error, {}});
      continue;
    }
    if (!o.token.has_value()) continue;  // a prompt with chunks left
    if (was_decoding) {
      ++seq.next_position;
    } else {
      seq.next_position = static_cast<int64_t>(seq.prompt.size());
    }
    if (seq.question_fed < seq.question.size()) {
      // A document's question is still being read: the model's pick is not
      // output, the question's next token is its next input.
      seq.next_token = seq.question[seq.question_fed++];
      if (!was_decoding) start_decoding();
      continue;
    }
    const std::optional<Ending> ending = output_.OnToken(seq, *o.token, o.logprobs, now);
    if (ending.has_value()) {
      Finish(take(), *ending);
    } else if (!was_decoding) {
      start_decoding();
    }
  }
}

void Scheduler::Finish(std::unique_ptr<Sequence> seq, const Ending& ending) {
  if (!seq) return;
  if (seq->admitted == Clock::time_point{}) --queued_;
  executor_->Release(*seq);
  output_.Finish(*seq, ending);
}

}  // namespace snapserve::scheduler
