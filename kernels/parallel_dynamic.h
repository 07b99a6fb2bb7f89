// A parallel loop whose items are handed out at run time. Internal to
// kernels/.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

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
// at::parallel_for does.
template <typename Fn>
void parallel_dynamic(int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  // One index per thread; each loops on the counter until it runs dry.
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), chunks);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(c * chunk, std::min(n, (c + 1) * chunk));
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
