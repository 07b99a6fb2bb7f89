// kernels/cpu/parallel_team.h.
#include "kernels/cpu/parallel_team.h"

#include <atomic>
#include <exception>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace snapserve::kernels {

namespace {

// One spin-wait iteration: a pause hint where there is one.
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// A loop posted to the team: its items, and how many have run. The padding
// is the point: `done`, which the threads write, has a cache line of its own.
struct alignas(64) Job {  // NOLINT(clang-analyzer-optin.performance.Padding)
  Job(cpu::ItemRef item, int64_t items) : item(item), items(items) {}

  cpu::ItemRef item;
  int64_t items;
  alignas(64) std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first item's exception, written before its done
};

void RunItem(Job& job, int64_t i);

// The team's shared state. Items are claimed from one word: the job's serial
// number (bits 40-63), its item count (bits 20-39) and the next unclaimed
// item (bits 0-19). A claim is a compare-and-swap on the whole word, so a
// thread can claim an item only of the job the word names, and that job
// lives until all its items are done: the leader waits for them before it
// posts the next job (whose pointer it writes first) or returns.
// The padding is the point here too: the word the threads claim from, and
// the closing flag, each on a cache line of their own.
class Team {  // NOLINT(clang-analyzer-optin.performance.Padding)
 public:
  static constexpr int64_t kMaxItems = (int64_t{1} << 20) - 1;

  explicit Team(int64_t threads) : threads_(threads) {}
  int64_t threads() const { return threads_; }

  // The leader: posts the job, runs items itself, waits for the others'.
  // It keeps item 0, so a loop's shares go to the same threads step after
  // step (kernels/cpu/parallel_dynamic.h: item t runs share t first).
  void Run(Job& job) {
    job_.store(&job, std::memory_order_relaxed);
    serial_ = (serial_ + 1) & kSerialMask;
    word_.store(Pack(serial_, job.items, 1), std::memory_order_release);
    RunItem(job, 0);
    Work(serial_);
    while (job.done.load(std::memory_order_acquire) < job.items) cpu_relax();
    if (job.failed.load(std::memory_order_relaxed)) std::rethrow_exception(job.error);
  }

  // Every other thread: runs the items of each job posted until Close().
  void Serve() {
    uint64_t seen = 0;  // the serial before the first job
    for (;;) {
      uint64_t w = word_.load(std::memory_order_acquire);
      // Jobs come microseconds apart within a step; past ~100 µs of spinning
      // the thread yields its core between looks.
      for (int64_t spins = 0; SerialOf(w) == seen; ++spins) {
        if (closing_.load(std::memory_order_acquire)) return;
        if (spins < kSpinsBeforeYield) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
        w = word_.load(std::memory_order_acquire);
      }
      seen = SerialOf(w);
      Work(seen);
    }
  }

  void Close() { closing_.store(true, std::memory_order_release); }

 private:
  static constexpr uint64_t kSerialMask = (uint64_t{1} << 24) - 1;
  static constexpr int64_t kSpinsBeforeYield = 20000;

  static uint64_t Pack(uint64_t serial, int64_t items, int64_t next) {
    return serial << 40 | static_cast<uint64_t>(items) << 20 | static_cast<uint64_t>(next);
  }
  static uint64_t SerialOf(uint64_t w) { return w >> 40; }
  static int64_t ItemsOf(uint64_t w) { return static_cast<int64_t>(w >> 20 & kMaxItems); }
  static int64_t NextOf(uint64_t w) { return static_cast<int64_t>(w & kMaxItems); }

  // Claims and runs items of job `serial` until none is left unclaimed.
  void Work(uint64_t serial);

  const int64_t threads_;
  uint64_t serial_ = 0;  // the leader's last posted serial
  alignas(64) std::atomic<uint64_t> word_{0};
  std::atomic<Job*> job_{nullptr};
  alignas(64) std::atomic<bool> closing_{false};
};

// The team the calling thread leads, and whether it is running one of the
// team's items (then loops nested in the item run on this thread alone).
thread_local Team* led_team = nullptr;
thread_local bool in_item = false;

void RunItem(Job& job, int64_t i) {
  const bool was_in_item = in_item;
  in_item = true;
  try {
    job.item(i);
  } catch (...) {
    if (!job.failed.exchange(true, std::memory_order_relaxed)) job.error = std::current_exception();
  }
  in_item = was_in_item;
  job.done.fetch_add(1, std::memory_order_release);
}

void Team::Work(uint64_t serial) {
  uint64_t w = word_.load(std::memory_order_acquire);
  while (SerialOf(w) == serial && NextOf(w) < ItemsOf(w)) {
    if (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      continue;
    }
    RunItem(*job_.load(std::memory_order_acquire), NextOf(w));
    w = word_.load(std::memory_order_acquire);
  }
}

// Leads `team` on this thread while alive; closes it however body ends.
class Leading {
 public:
  explicit Leading(Team& team) : team_(team) { led_team = &team; }
  ~Leading() {
    led_team = nullptr;
    team_.Close();
  }
  Leading(const Leading&) = delete;
  Leading& operator=(const Leading&) = delete;

 private:
  Team& team_;
};

}  // namespace

void run_as_team(const std::function<void()>& body) {
  const int64_t threads = at::get_num_threads();
  if (threads < 2 || at::in_parallel_region() || led_team != nullptr) {
    body();
    return;
  }
  Team team(threads);
  const std::thread::id caller = std::this_thread::get_id();
  // One index per thread; the calling thread (OpenMP's primary thread, which
  // takes part in the region) leads, the others serve. Should the runtime
  // give fewer threads, the leader runs every item itself.
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller) {
      const Leading leading(team);
      body();
    } else {
      team.Serve();
    }
  });
}

namespace cpu {

int64_t team_threads() { return led_team != nullptr && !in_item ? led_team->threads() : 0; }

void run_items(int64_t items, ItemRef item) {
  if (items <= 0) return;
  if (team_threads() > 0 && items <= Team::kMaxItems) {
    Job job(item, items);
    led_team->Run(job);
    return;
  }
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) item(i);
  });
}

}  // namespace cpu
}  // namespace snapserve::kernels
