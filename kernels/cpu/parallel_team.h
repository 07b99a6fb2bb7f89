// A team of threads kept together for a stretch of work made of many short
// parallel loops, such as a decode step.
//
// Why: a batch-1 decode step runs ~150 parallel loops (five products and the
// attention per layer), each a few microseconds long. Through at::parallel_for
// each is an OpenMP fork and join: ~450 ns on this project's 2-core Zen 5 VM,
// and libgomp's fork/join code was ~3 % of the step's samples on the engine
// thread. Inside a team the other threads wait in a spin loop, and a loop is
// handed to them by writing one cache line: ~50 ns (docs/quantized-weights.md,
// "The decode thread team").
//
// The engine opens a team around a step (run_as_team, engine/model); the
// kernels' loops (parallel_for here, parallel_shares and parallel_dynamic in
// kernels/cpu/parallel_dynamic.h) run on the team when the calling thread leads
// one, else through at::parallel_for as before.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <functional>

namespace snapserve::kernels {

// Runs body() on the calling thread while the other at::get_num_threads() - 1
// threads wait, spinning, for the loops body starts in the kernels (below).
// A loop that body starts in LibTorch itself runs on the calling thread
// alone, as inside any parallel region: body's heavy work must go through
// snapserve's kernels. Runs body() alone on one thread, inside a parallel
// region, or inside a team. An exception from body or from an item of its
// loops ends the team and propagates.
void run_as_team(const std::function<void()>& body);

namespace cpu {

// A reference to a callable taking an item index; it must outlive the call
// it is passed to (no allocation, unlike std::function).
class ItemRef {
 public:
  template <typename Fn>
  ItemRef(const Fn& fn)  // NOLINT(google-explicit-constructor): passed as a lambda
      : ctx_(&fn), call_([](const void* ctx, int64_t i) { (*static_cast<const Fn*>(ctx))(i); }) {}
  void operator()(int64_t i) const { call_(ctx_, i); }

 private:
  const void* ctx_;
  void (*call_)(const void*, int64_t);
};

// The number of threads of the team the calling thread leads, or 0 when it
// leads none (or runs one of the team's items: loops nested in an item run
// on its thread alone).
int64_t team_threads();

// Calls item(i) for every i in [0, items), each once, on any thread of the
// team (team_threads() > 0) or else through at::parallel_for, one index per
// thread. Returns when every call returned; rethrows the first exception one
// of them threw. The items must not depend on which thread runs them.
void run_items(int64_t items, ItemRef item);

// at::parallel_for's contract (fn(b, e) over contiguous chunks of at least
// `grain` items covering [begin, end), on one thread when the range is
// shorter than grain), run on the team when the calling thread leads one.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
  const int64_t threads = team_threads();
  if (threads == 0) {
    at::parallel_for(begin, end, grain, fn);
    return;
  }
  const int64_t n = end - begin;
  if (n <= 0) return;
  if (n < grain) {
    fn(begin, end);
    return;
  }
  const int64_t chunks =
      std::min(threads, (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
  const int64_t chunk = (n + chunks - 1) / chunks;
  run_items(chunks, [&](int64_t i) {
    const int64_t b = begin + i * chunk;
    if (b < end) fn(b, std::min(end, b + chunk));
  });
}

}  // namespace cpu
}  // namespace snapserve::kernels
