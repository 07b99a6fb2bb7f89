// FakeStepExecutor: a StepExecutor (engine/scheduler/step_executor.h) without
// a model, so the scheduler loop is tested on its own
// (docs/kv-cache-and-scheduling.md, "The scheduler loop"). It counts KV blocks
// as the paged cache does (a sequence holds reserve_blocks from Admit to
// Release), keeps each prompt's progress in its Sequence's
// prompt_state as ModelExecutor does, answers kToken for every decoding
// sequence and every prompt whose last chunk ran, and records every Run() with
// the state it saw. A test can hold the loop inside one Run() (PauseWhen) to
// cancel, pass a deadline or shut down while a chunk is running.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler/step_executor.h"

namespace snapserve::scheduler::fake {

// A prompt chunk as it ran: `tokens` prompt tokens from position `start`.
struct ChunkRecord {
  std::string request;
  int64_t start = 0;
  int64_t tokens = 0;
};

// A prompt in prefill when a step began, with the prompt tokens it had left.
struct PromptLeft {
  std::string request;
  int64_t left = 0;
};

// One Run(): what the loop asked for, and the executor's state before it.
struct RunRecord {
  std::vector<std::string> decoded;  // request ids, in the batch's order
  std::vector<ChunkRecord> chunks;   // in the order they ran
  // Admitted and not released: prompts not finished (admission order), and
  // sequences whose prompt finished (they should all decode).
  std::vector<PromptLeft> prefilling;
  std::set<std::string> decoding;

  int64_t prompt_tokens() const {
    int64_t n = 0;
    for (const ChunkRecord& c : chunks) n += c.tokens;
    return n;
  }
};

class FakeStepExecutor final : public StepExecutor {
 public:
  static constexpr int32_t kToken = 'a';  // byte-level id of "a"

  explicit FakeStepExecutor(int64_t total_blocks) : total_(total_blocks), free_(total_blocks) {}

  Status Admit(Sequence& seq) override {
    const int64_t need = seq.reserve_blocks;
    std::lock_guard<std::mutex> lock(mu_);
    if (need > free_) {
      ++admit_failures_;
      return Status::Internal("fake: " + std::to_string(need) + " blocks asked, " +
                              std::to_string(free_) + " free");
    }
    free_ -= need;
    held_[seq.id] = {seq.request_id, need, static_cast<int64_t>(seq.prompt.size()), 0, order_++};
    admitted_.push_back(seq.request_id);
    max_held_ = std::max(max_held_, static_cast<int64_t>(held_.size()));
    seq.prompt_state.emplace();
    seq.prompt_state->seq = seq.id;
    seq.prompt_state->tokens = seq.prompt;
    return Status::Ok();
  }

  void Release(Sequence& seq) override {
    seq.prompt_state.reset();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(seq.id);
    if (it == held_.end()) return;  // never admitted
    free_ += it->second.blocks;
    released_.push_back(seq.request_id);
    held_.erase(it);
  }

  StepResult Run(const std::vector<Sequence*>& decode,
                 const std::vector<ChunkWork>& prefill) override {
    StepResult result;
    std::unique_lock<std::mutex> lock(mu_);
    RunRecord run = Snapshot();
    for (Sequence* seq : decode) {
      run.decoded.push_back(seq->request_id);
      result.outcomes.push_back({seq, kToken, Status::Ok(), std::nullopt});
    }
    for (const ChunkWork& c : prefill) {
      Held& h = held_.at(c.seq->id);
      run.chunks.push_back({h.request, h.done, c.tokens});
      result.outcomes.push_back(RunChunk(*c.seq, h, c.tokens));
    }
    runs_.push_back(run);
    if (pause_when_ && pause_when_(run)) {
      // Hold the loop here, inside the step, until Resume().
      pause_when_ = nullptr;
      paused_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !paused_; });
    }
    return result;
  }

  int64_t free_blocks() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return free_;
  }
  int64_t total_blocks() const override { return total_; }
  double usage_ratio() const override {
    return total_ == 0 ? 0.0 : static_cast<double>(total_ - free_blocks()) / total_;
  }

  // The next Run() for which `when` holds blocks until Resume().
  void PauseWhen(std::function<bool(const RunRecord&)> when) {
    std::lock_guard<std::mutex> lock(mu_);
    pause_when_ = std::move(when);
  }
  // Whether the loop got held inside a Run() within `timeout`.
  bool WaitPaused(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return paused_; });
  }
  void Resume() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = false;
    }
    cv_.notify_all();
  }

  std::vector<RunRecord> runs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return runs_;
  }
  std::vector<std::string> admitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return admitted_;
  }
  std::vector<std::string> released() const {
    std::lock_guard<std::mutex> lock(mu_);
    return released_;
  }
  int64_t max_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_held_;
  }
  int64_t admit_failures() const {
    std::lock_guard<std::mutex> lock(mu_);
    return admit_failures_;
  }
  // Chunks that did not fit the prompt (empty, or past its end).
  int64_t bad_chunks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_chunks_;
  }

 private:
  struct Held {
    std::string request;
    int64_t blocks = 0;
    int64_t prompt = 0;  // prompt tokens
    int64_t done = 0;    // prompt tokens run
    int64_t order = 0;   // admission order
  };

  // Under mu_.
  RunRecord Snapshot() const {
    std::vector<const Held*> by_order;
    for (const auto& [id, h] : held_) by_order.push_back(&h);
    std::sort(by_order.begin(), by_order.end(),
              [](const Held* a, const Held* b) { return a->order < b->order; });
    RunRecord run;
    for (const Held* h : by_order) {
      if (h->done < h->prompt) {
        run.prefilling.push_back({h->request, h->prompt - h->done});
      } else {
        run.decoding.insert(h->request);
      }
    }
    return run;
  }

  // Under mu_. Advances the prompt by `tokens`; its first token comes with
  // its last chunk, when its prompt state goes, as in ModelExecutor.
  StepOutcome RunChunk(Sequence& seq, Held& h, int64_t tokens) {
    if (tokens <= 0 || h.done + tokens > h.prompt || !seq.prompt_state) {
      ++bad_chunks_;
      return {&seq, std::nullopt, Status::Internal("fake: bad chunk"), std::nullopt};
    }
    h.done += tokens;
    seq.prompt_state->done = h.done;
    if (h.done < h.prompt) return {&seq, std::nullopt, Status::Ok(), std::nullopt};
    seq.prompt_state.reset();
    return {&seq, kToken, Status::Ok(), std::nullopt};
  }

  const int64_t total_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t free_;
  std::map<int64_t, Held> held_;  // by sequence id
  int64_t order_ = 0;
  std::vector<std::string> admitted_;
  std::vector<std::string> released_;
  int64_t max_held_ = 0;
  int64_t admit_failures_ = 0;
  int64_t bad_chunks_ = 0;
  std::vector<RunRecord> runs_;
  std::function<bool(const RunRecord&)> pause_when_;
  bool paused_ = false;
};

}  // namespace snapserve::scheduler::fake
