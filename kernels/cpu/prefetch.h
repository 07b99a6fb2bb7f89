// Software prefetch spread over a loop, for the CPU kernels. Internal to
// kernels/.
#pragma once

#include <cstdint>

namespace snapserve::kernels::cpu {

// Prefetches `bytes` bytes from `p` into L2, a few cache lines per step()
// over `steps` calls, so the next block arrives while this one computes.
// Measured on 30 layers × batch 16 × 600 entries (442 MB, not cached):
// none 28.5 ms, a burst of the whole block up front 28.5, spread into L1 26.7,
// spread into L2 19.0 (two blocks ahead: the same).
// Prefetches [p, p + bytes) into L2 now (a few lines: e.g. the next cache
// block's int8 scales, which the spread prefetch of its rows does not cover).
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 2);
}

class SpreadPrefetch {
 public:
  SpreadPrefetch() = default;
  SpreadPrefetch(const void* p, int64_t bytes, int64_t steps)
      : p_(static_cast<const char*>(p)),
        end_(p_ + bytes),
        per_step_((bytes / 64 + steps - 1) / steps) {}
  void step() {
    for (int64_t i = 0; i < per_step_ && p_ < end_; ++i, p_ += 64) __builtin_prefetch(p_, 0, 2);
  }

 private:
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  int64_t per_step_ = 0;
};

}  // namespace snapserve::kernels::cpu
