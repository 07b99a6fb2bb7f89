// The whole scheduler loop (Scheduler: inbox, Schedule(), executor, output
// processor, its thread) on a FakeStepExecutor, no model
// (docs/kv-cache-and-scheduling.md, "The scheduler loop", "Chunked prefill",
// "Admission and reservation"). Every expectation is checked against what the
// fake recorded of each step or against the sinks, never against the
// planner's own output.
#include "engine/scheduler/scheduler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/tokenizer/byte_level_bpe.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/unit/scheduler/fake_step_executor.h"

namespace snapserve::scheduler {
namespace {

using fake::FakeStepExecutor;
using fake::RunRecord;
using std::chrono::milliseconds;

constexpr int64_t kBlockSize = 4;     // tokens per block, as the tests count them
constexpr milliseconds kWait{30000};  // generous: the machine may pause us

// Records what the loop reports for one request.
class RecordingSink final : public engine::ResultSink {
 public:
  void OnDelta(const std::vector<uint32_t>& ids, const std::string&,
               const std::vector<engine::TokenLogprob>&) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_ += static_cast<int64_t>(ids.size());
    cv_.notify_all();
  }
  void OnFinish(const Status& status, engine::FinishReason reason, const engine::Usage&) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++finishes_;
    status_ = status;
    reason_ = reason;
    cv_.notify_all();
  }
  bool WaitFinished() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, [&] { return finishes_ > 0; });
  }
  int finishes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finishes_;
  }
  StatusCode code() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_.code();
  }
  engine::FinishReason reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  int64_t tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t tokens_ = 0;
  int finishes_ = 0;
  Status status_;
  engine::FinishReason reason_{};
};

// The byte-level character that stands for `byte`, UTF-8 encoded.
std::string ByteLevelChar(uint8_t byte) {
  std::string s;
  tokenizer::AppendUtf8(tokenizer::ByteToCodePoint(byte), &s);
  return s;
}

// The incremental decoder needs a tokenizer: the smallest byte-level BPE one,
// id b = byte b, no merges, no special tokens (so no EOS either).
std::unique_ptr<tokenizer::Tokenizer> ByteTokenizer() {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("scheduler_loop_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<uint8_t>(b))] = b;
  const nlohmann::json tj = {
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  auto t = tokenizer::Tokenizer::FromHfDirectory(dir.string());
  std::filesystem::remove_all(dir);
  if (!t.ok()) ADD_FAILURE() << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

class SchedulerLoopTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = ByteTokenizer().release(); }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  void TearDown() override {
    if (!scheduler_) return;
    fake_->PauseWhen(nullptr);
    fake_->Resume();  // a failed test may have left the loop held
    scheduler_->Shutdown();
  }

  // max_step_tokens = `step_tokens`, blocks of 4 tokens.
  void Start(int64_t batch, int64_t step_tokens, int64_t total_blocks, int64_t max_queue = 100) {
    ASSERT_NE(tokenizer_, nullptr);
    limits_ = StepLimits{batch, step_tokens, /*max_prefill_tokens=*/4096};
    auto executor = std::make_unique<FakeStepExecutor>(total_blocks);
    fake_ = executor.get();
    scheduler_ =
        std::make_unique<Scheduler>(std::move(executor), SchedulerOptions{limits_, max_queue});
  }

  // A request of `prompt` tokens that stops after `max_new` tokens; its
  // sink is sinks_[id]. `out` (optional) gets the Sequence while it lives.
  Status Submit(const std::string& id, int64_t prompt, int64_t max_new, Sequence** out = nullptr) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_seq_id_++;
    seq->request_id = id;
    seq->prompt.assign(static_cast<size_t>(prompt), 'p');
    seq->compression.method = engine::KvMethod::kNone;
    seq->max_new_tokens = max_new;
    seq->reserve_blocks = (prompt + max_new + kBlockSize - 1) / kBlockSize;
    auto sink = std::make_shared<RecordingSink>();
    sinks_[id] = sink;
    seq->sink = sink;
    seq->sampler = std::make_unique<sampling::Sampler>(sampling::SamplingParams{}, seq->prompt);
    sampling::StopCriteria stop;
    stop.max_new_tokens = max_new;
    seq->stop = std::make_unique<sampling::StopMatcher>(stop);
    seq->decoder = std::make_unique<tokenizer::IncrementalDecoder>(*tokenizer_);
    seq->arrival = Clock::now();
    prompt_len_[id] = prompt;
    if (out != nullptr) *out = seq.get();
    return scheduler_->Submit(std::move(seq));
  }

  RecordingSink& sink(const std::string& id) { return *sinks_.at(id); }

  // Submits `id` and holds the loop inside the step that runs its first
  // chunk, so that what the test submits next arrives while `id` is admitted
  // and unfinished. (The fake answers at once: without the hold, a request
  // could end before the next one is even submitted.)
  ::testing::AssertionResult SubmitAndHold(const std::string& id, int64_t prompt, int64_t max_new) {
    fake_->PauseWhen([id](const RunRecord& r) { return HasChunkOf(r, id); });
    const Status submitted = Submit(id, prompt, max_new);
    if (!submitted.ok()) return ::testing::AssertionFailure() << id << ": " << submitted.message();
    if (!fake_->WaitPaused(kWait)) return ::testing::AssertionFailure() << id << " never ran";
    return ::testing::AssertionSuccess();
  }
  // Lets the held loop go on until the first step for which `when` holds,
  // and holds it inside that one.
  ::testing::AssertionResult ResumeUntil(std::function<bool(const RunRecord&)> when) {
    fake_->PauseWhen(std::move(when));
    fake_->Resume();
    if (!fake_->WaitPaused(kWait)) return ::testing::AssertionFailure() << "no such step";
    return ::testing::AssertionSuccess();
  }

  // Waits for every listed request to end OK after `max_new` tokens.
  void ExpectCompleted(const std::vector<std::string>& ids, int64_t max_new) {
    for (const std::string& id : ids) {
      ASSERT_TRUE(sink(id).WaitFinished()) << id;
      EXPECT_EQ(sink(id).code(), StatusCode::kOk) << id;
      EXPECT_EQ(sink(id).reason(), engine::FinishReason::kLength) << id;
      EXPECT_EQ(sink(id).tokens(), max_new) << id;
      EXPECT_EQ(sink(id).finishes(), 1) << id;
    }
  }

  // No block leaked once every request ended.
  void ExpectAllBlocksFree() {
    EXPECT_EQ(fake_->free_blocks(), fake_->total_blocks());
    EXPECT_EQ(fake_->admit_failures(), 0);
    EXPECT_EQ(fake_->bad_chunks(), 0);
  }

  static int64_t ChunksOf(const std::vector<RunRecord>& runs, const std::string& id) {
    int64_t n = 0;
    for (const RunRecord& r : runs) {
      n += std::count_if(r.chunks.begin(), r.chunks.end(),
                         [&](const fake::ChunkRecord& c) { return c.request == id; });
    }
    return n;
  }
  static bool HasChunkOf(const RunRecord& r, const std::string& id) {
    return std::any_of(r.chunks.begin(), r.chunks.end(),
                       [&](const fake::ChunkRecord& c) { return c.request == id; });
  }
  static bool Decoded(const RunRecord& r, const std::string& id) {
    return std::find(r.decoded.begin(), r.decoded.end(), id) != r.decoded.end();
  }

  static tokenizer::Tokenizer* tokenizer_;
  StepLimits limits_;
  FakeStepExecutor* fake_ = nullptr;  // owned by scheduler_
  std::unique_ptr<Scheduler> scheduler_;
  int64_t next_seq_id_ = 1;
  std::map<std::string, std::shared_ptr<RecordingSink>> sinks_;
  std::map<std::string, int64_t> prompt_len_;
};

tokenizer::Tokenizer* SchedulerLoopTest::tokenizer_ = nullptr;

TEST_F(SchedulerLoopTest, AdmitsFcfsWithinTheBatchSizeAndBoundsTheQueue) {
  Start(/*batch=*/2, /*step_tokens=*/64, /*total_blocks=*/100, /*max_queue=*/3);
  // Hold the loop inside r0's step so the queue fills deterministically.
  ASSERT_TRUE(SubmitAndHold("r0", 5, 3));
  for (const char* id : {"r1", "r2", "r3"}) ASSERT_TRUE(Submit(id, 5, 3).ok()) << id;
  const Status full = Submit("r4", 5, 3);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.message();
  EXPECT_EQ(scheduler_->Stats().waiting, 3);
  EXPECT_EQ(scheduler_->Stats().kv_blocks_total, 100);
  fake_->Resume();

  ExpectCompleted({"r0", "r1", "r2", "r3"}, 3);
  EXPECT_EQ(fake_->admitted(), (std::vector<std::string>{"r0", "r1", "r2", "r3"}));
  EXPECT_EQ(fake_->max_held(), 2);  // the batch bound, reached and never passed
  EXPECT_EQ(sink("r4").finishes(), 0);
  ExpectAllBlocksFree();
}

TEST_F(SchedulerLoopTest, AdmissionWaitsForFreeBlocks) {
  // 4 blocks of 4 tokens; each request reserves 4 + 4 tokens = 2 blocks, so
  // two fit at once although the batch has room for eight.
  Start(/*batch=*/8, /*step_tokens=*/64, /*total_blocks=*/4);
  ASSERT_TRUE(SubmitAndHold("b0", 4, 4));
  for (const char* id : {"b1", "b2", "b3"}) ASSERT_TRUE(Submit(id, 4, 4).ok()) << id;
  fake_->Resume();

  ExpectCompleted({"b0", "b1", "b2", "b3"}, 4);
  EXPECT_EQ(fake_->admitted(), (std::vector<std::string>{"b0", "b1", "b2", "b3"}));
  EXPECT_EQ(fake_->max_held(), 2);
  ExpectAllBlocksFree();  // includes: no Admit() ever found its blocks missing
}

TEST_F(SchedulerLoopTest, StepsKeepTheTokenBudgetAndCutPromptsOnTheGrid) {
  constexpr int64_t kB = 8;
  Start(/*batch=*/8, kB, /*total_blocks=*/1000);
  const std::vector<std::pair<std::string, int64_t>> prompts = {{"g0", 20}, {"g1", 3}, {"g2", 8},
                                                                {"g3", 13}, {"g4", 5}, {"g5", 17}};
  // All but the first arrive together, while g0's first chunk runs.
  ASSERT_TRUE(SubmitAndHold("g0", 20, 4));
  for (size_t i = 1; i < prompts.size(); ++i) {
    ASSERT_TRUE(Submit(prompts[i].first, prompts[i].second, 4).ok());
  }
  fake_->Resume();
  std::vector<std::string> ids;
  for (const auto& [id, n] : prompts) ids.push_back(id);
  ExpectCompleted(ids, 4);
  EXPECT_EQ(fake_->admitted(), ids);  // FCFS

  const std::vector<RunRecord> runs = fake_->runs();
  std::map<std::string, int64_t> next_start;  // where each prompt's next chunk begins
  bool shared_step = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& r = runs[i];
    SCOPED_TRACE("step " + std::to_string(i));
    // At most B prompt tokens; decode tokens come on top, one per decoding
    // sequence, every one of them.
    EXPECT_LE(r.prompt_tokens(), kB);
    EXPECT_EQ(std::set<std::string>(r.decoded.begin(), r.decoded.end()), r.decoding);
    EXPECT_EQ(r.decoded.size(), r.decoding.size());
    // Chunks: the prompts in prefill in admission order, without skipping
    // one, as many as fit (the first always runs).
    ASSERT_LE(r.chunks.size(), r.prefilling.size());
    if (!r.prefilling.empty()) EXPECT_FALSE(r.chunks.empty());
    for (size_t c = 0; c < r.chunks.size(); ++c) {
      EXPECT_EQ(r.chunks[c].request, r.prefilling[c].request);
    }
    if (r.chunks.size() < r.prefilling.size()) {
      const int64_t next = std::min(kB, r.prefilling[r.chunks.size()].left);
      EXPECT_GT(r.prompt_tokens() + next, kB) << "a chunk that fit was left out";
    }
    shared_step |= r.chunks.size() > 1;
    // Cut on the grid of B from the prompt's start.
    for (const fake::ChunkRecord& c : r.chunks) {
      const int64_t n = prompt_len_.at(c.request);
      EXPECT_EQ(c.start, next_start[c.request]) << c.request;
      EXPECT_EQ(c.start % kB, 0) << c.request;
      EXPECT_EQ(c.tokens, std::min(kB, n - c.start)) << c.request;
      next_start[c.request] = c.start + c.tokens;
    }
  }
  for (const auto& [id, n] : prompts) EXPECT_EQ(next_start[id], n) << id;
  EXPECT_TRUE(shared_step);  // the scenario did put several prompts in one step
  ExpectAllBlocksFree();
}

TEST_F(SchedulerLoopTest, ALongPromptNeverHoldsDecodeBack) {
  constexpr int64_t kB = 8;
  constexpr int64_t kLong = 43;  // ceil(43 / 8) = 6 chunks
  constexpr int64_t kNew = 50;
  Start(/*batch=*/8, kB, /*total_blocks=*/1000);
  // The long prompt arrives once s0..s2 all decode.
  ASSERT_TRUE(SubmitAndHold("s0", 4, kNew));
  for (const char* id : {"s1", "s2"}) ASSERT_TRUE(Submit(id, 4, kNew).ok());
  ASSERT_TRUE(ResumeUntil([](const RunRecord& r) { return r.decoded.size() == 3; }));
  ASSERT_TRUE(Submit("long", kLong, 2).ok());
  fake_->Resume();
  ExpectCompleted({"s0", "s1", "s2"}, kNew);
  ExpectCompleted({"long"}, 2);

  const std::vector<RunRecord> runs = fake_->runs();
  std::vector<size_t> long_steps;
  size_t admitted_at = runs.size();
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& r = runs[i];
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_LE(r.prompt_tokens(), kB);
    EXPECT_EQ(std::set<std::string>(r.decoded.begin(), r.decoded.end()), r.decoding);
    if (HasChunkOf(r, "long")) long_steps.push_back(i);
    const bool long_in_prefill =
        std::any_of(r.prefilling.begin(), r.prefilling.end(),
                    [](const fake::PromptLeft& p) { return p.request == "long"; });
    if (long_in_prefill && admitted_at == runs.size()) admitted_at = i;
  }
  // Its chunks run in consecutive steps from the step of its admission:
  // done within ceil(len / B) steps.
  ASSERT_EQ(long_steps.size(), 6u);
  EXPECT_EQ(long_steps.front(), admitted_at);
  EXPECT_EQ(long_steps.back(), admitted_at + 5);
  // Meanwhile every short request got its token in every one of those steps,
  // and in fact in every step from its first decode to its last (kNew - 1
  // decode steps after the prompt's token).
  for (const char* id : {"s0", "s1", "s2"}) {
    for (size_t i : long_steps) EXPECT_TRUE(Decoded(runs[i], id)) << id << " step " << i;
    std::vector<size_t> steps;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (Decoded(runs[i], id)) steps.push_back(i);
    }
    ASSERT_EQ(steps.size(), static_cast<size_t>(kNew - 1)) << id;
    EXPECT_EQ(steps.back() - steps.front(), steps.size() - 1) << id << ": a step without its token";
  }
  ExpectAllBlocksFree();
}

TEST_F(SchedulerLoopTest, CancelMidPrefillEndsTheRequestAndFreesItsBlocks) {
  Start(/*batch=*/4, /*step_tokens=*/8, /*total_blocks=*/1000);
  ASSERT_TRUE(SubmitAndHold("other", 4, 20));
  ASSERT_TRUE(Submit("p", 32, 4).ok());  // 4 chunks
  ASSERT_TRUE(ResumeUntil([](const RunRecord& r) { return HasChunkOf(r, "p"); }));
  scheduler_->Cancel("p");  // while its first chunk runs
  fake_->Resume();

  ASSERT_TRUE(sink("p").WaitFinished());
  EXPECT_EQ(sink("p").code(), StatusCode::kCancelled);
  EXPECT_EQ(sink("p").tokens(), 0);
  ExpectCompleted({"other"}, 20);
  const std::vector<RunRecord> runs = fake_->runs();
  EXPECT_EQ(ChunksOf(runs, "p"), 1);
  // Released before the next step ran: no later step sees it held; and
  // "other" went on decoding in that next step.
  size_t first = 0;
  while (first < runs.size() && !HasChunkOf(runs[first], "p")) ++first;
  ASSERT_LT(first + 1, runs.size());
  EXPECT_TRUE(Decoded(runs[first + 1], "other"));
  for (size_t i = first + 1; i < runs.size(); ++i) {
    const bool held = runs[i].decoding.contains("p") ||
                      std::any_of(runs[i].prefilling.begin(), runs[i].prefilling.end(),
                                  [](const fake::PromptLeft& l) { return l.request == "p"; });
    EXPECT_FALSE(held) << "step " << i;
  }
  const std::vector<std::string> released = fake_->released();
  EXPECT_EQ(std::count(released.begin(), released.end(), "p"), 1);
  EXPECT_EQ(sink("p").finishes(), 1);
  ExpectAllBlocksFree();
}

TEST_F(SchedulerLoopTest, CancelWhileWaitingEndsWithoutAdmission) {
  Start(/*batch=*/1, /*step_tokens=*/8, /*total_blocks=*/1000);
  ASSERT_TRUE(SubmitAndHold("a", 4, 5));
  ASSERT_TRUE(Submit("w", 4, 5).ok());  // waits: the batch holds one
  scheduler_->Cancel("w");
  fake_->Resume();
  ASSERT_TRUE(sink("w").WaitFinished());
  EXPECT_EQ(sink("w").code(), StatusCode::kCancelled);
  ExpectCompleted({"a"}, 5);
  EXPECT_EQ(fake_->admitted(), std::vector<std::string>{"a"});
  ExpectAllBlocksFree();
}

TEST_F(SchedulerLoopTest, DeadlineMidPrefillEndsTheRequestAndFreesItsBlocks) {
  Start(/*batch=*/4, /*step_tokens=*/8, /*total_blocks=*/1000);
  ASSERT_TRUE(SubmitAndHold("other", 4, 20));
  Sequence* p = nullptr;
  ASSERT_TRUE(Submit("p", 32, 4, &p).ok());
  ASSERT_TRUE(ResumeUntil([](const RunRecord& r) { return HasChunkOf(r, "p"); }));
  // The deadline passes while the first chunk runs. The loop is held inside
  // Run(), so it does not touch `p` now; Resume() orders this write before
  // the loop's next read.
  p->deadline = Clock::now();
  fake_->Resume();

  ASSERT_TRUE(sink("p").WaitFinished());
  EXPECT_EQ(sink("p").code(), StatusCode::kDeadlineExceeded);
  ExpectCompleted({"other"}, 20);
  EXPECT_EQ(ChunksOf(fake_->runs(), "p"), 1);
  EXPECT_EQ(sink("p").finishes(), 1);
  ExpectAllBlocksFree();
}

TEST_F(SchedulerLoopTest, ShutdownEndsEveryRequestOnceWithUnavailable) {
  Start(/*batch=*/2, /*step_tokens=*/8, /*total_blocks=*/1000);
  // "dec" decodes, "pre" is in its second chunk, "q1" and "q2" wait (batch
  // full) when shutdown comes.
  ASSERT_TRUE(SubmitAndHold("dec", 4, 1000));
  ASSERT_TRUE(Submit("pre", 32, 1000).ok());
  ASSERT_TRUE(Submit("q1", 4, 1000).ok());
  ASSERT_TRUE(Submit("q2", 4, 1000).ok());
  ASSERT_TRUE(ResumeUntil([](const RunRecord& r) {
    return std::any_of(r.chunks.begin(), r.chunks.end(), [](const fake::ChunkRecord& c) {
      return c.request == "pre" && c.start > 0;
    });
  }));
  EXPECT_GT(sink("dec").tokens(), 0);

  auto shutdown = std::async(std::launch::async, [&] { scheduler_->Shutdown(); });
  // Submit until refused: the first refusal shows shutdown began; whatever
  // got in before it must end like the rest.
  std::vector<std::string> late;
  Status refused;
  const auto give_up = Clock::now() + kWait;
  for (int i = 0; Clock::now() < give_up; ++i) {
    const std::string id = "late" + std::to_string(i);
    refused = Submit(id, 4, 4);
    if (!refused.ok()) break;
    late.push_back(id);
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.message();
  const std::string refused_id = "late" + std::to_string(late.size());
  fake_->Resume();
  ASSERT_EQ(shutdown.wait_for(kWait), std::future_status::ready);  // the thread joined

  std::vector<std::string> ended = {"dec", "pre", "q1", "q2"};
  ended.insert(ended.end(), late.begin(), late.end());
  for (const std::string& id : ended) {
    EXPECT_EQ(sink(id).finishes(), 1) << id;
    EXPECT_EQ(sink(id).code(), StatusCode::kUnavailable) << id;
  }
  EXPECT_EQ(sink(refused_id).finishes(), 0);
  EXPECT_EQ(Submit("after", 4, 4).code(), StatusCode::kUnavailable);
  EXPECT_EQ(sink("after").finishes(), 0);
  scheduler_->Shutdown();  // idempotent
  EXPECT_EQ(fake_->admitted(), (std::vector<std::string>{"dec", "pre"}));
  ExpectAllBlocksFree();
}

}  // namespace
}  // namespace snapserve::scheduler
