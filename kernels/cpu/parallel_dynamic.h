// A parallel loop whose items are handed out at run time. Internal to
// kernels/.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "kernels/cpu/parallel_team.h"

namespace snapserve::kernels::cpu {

// Calls fn(begin, end) over [0, n) in chunks of `chunk` items that the
// threads take from a shared counter, instead of at::parallel_for's one
// fixed share per thread.
//
// Why: on a shared VM one core often runs slower than the other for a
// while (another tenant's work), and with fixed shares the fast thread then
// waits at the end of every loop; libgomp's spin was 6-9 % of a 2048-token
// prefill's samples. A thread that is ahead here takes more chunks.
//
// Each item must be computed the same way whichever thread takes it (true
// of the callers: an item owns its outputs), so results do not depend on the
// schedule. Nested inside another parallel region it runs serially, as
// at::parallel_for does. Both loops here run on the calling thread's team
// when it leads one (kernels/cpu/parallel_team.h).
template <typename Fn>
void parallel_dynamic(int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  // One index per thread; each loops on the counter until it runs dry.
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), chunks);
  run_items(workers, [&](int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

// Calls fn(begin, end) over [0, n) (n < 2^31): each thread runs its own
// contiguous share front to back, `chunk` items at a time, and a thread done
// with its share then takes chunks from the back of the others' shares.
//
// Why: decode-sized products stream their weights, and one contiguous share
// per thread streams better than chunks handed out in turn (a batch-1 step
// was ~15 % slower with interleaved panels); but with fixed shares the
// thread on the faster core waited at the end of each product, and a
// batch-1 step's libgomp waits were ~17 % of its samples. Here both hold:
// shares stay contiguous, and whichever thread finishes first takes work
// from the other's far end.
//
// As parallel_dynamic: an item must be computed the same way whichever
// thread takes it; nested, it runs serially.
template <typename Fn>
void parallel_shares(int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), (n + chunk - 1) / chunk);
  // A share's remaining [front, back), front in the low 32 bits.
  struct alignas(64) Share {
    std::atomic<uint64_t> range;
  };
  const auto pack = [](uint64_t front, uint64_t back) { return front | (back << 32); };
  // On the stack for the usual thread counts: a batch-1 step runs ~120
  // of these loops, and each heap allocation and free cost more than the
  // loop's own bookkeeping.
  constexpr int64_t kStackShares = 16;
  Share stack_shares[kStackShares];
  std::unique_ptr<Share[]> heap_shares(
      workers > kStackShares ? new Share[static_cast<size_t>(workers)] : nullptr);
  Share* shares = heap_shares ? heap_shares.get() : stack_shares;
  for (int64_t t = 0; t < workers; ++t) {
    shares[t].range.store(pack(n * t / workers, n * (t + 1) / workers), std::memory_order_relaxed);
  }
  // Takes up to `chunk` items from the front (own share) or the back (another's).
  const auto take = [&](Share& s, bool front, int64_t& begin, int64_t& end) {
    uint64_t r = s.range.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(r & 0xFFFFFFFFu), b = static_cast<int64_t>(r >> 32);
      if (f >= b) return false;
      begin = front ? f : std::max(f, b - chunk);
      end = front ? std::min(b, f + chunk) : b;
      const uint64_t next = front ? pack(end, b) : pack(f, begin);
      if (s.range.compare_exchange_weak(r, next, std::memory_order_relaxed)) return true;
    }
  };
  // Item t runs share t, then takes from the others' backs.
  run_items(workers, [&](int64_t t) {
    int64_t begin = 0, end = 0;
    while (take(shares[t], true, begin, end)) fn(begin, end);
    for (int64_t v = 1; v < workers; ++v) {
      while (take(shares[(t + v) % workers], false, begin, end)) fn(begin, end);
    }
  });
}

// A chunk size giving each of the threads about `per_thread` chunks of `n`
// items: enough to even out the threads, few enough that taking a chunk
// (one atomic add on a shared line) stays negligible beside its work.
inline int64_t chunk_for(int64_t n, int64_t per_thread = 8) {
  const int64_t threads = std::max<int64_t>(at::get_num_threads(), 1);
  return std::max<int64_t>(1, n / (threads * per_thread));
}

}  // namespace snapserve::kernels::cpu
