// Scratch memory a thread keeps from one call to the next, for kernels that
// run many times a step on small inputs. Internal to kernels/.
//
// Why: a batch-1 decode step runs ~120 int8 products (kernels/
// prefill_gemm_int8.h), each needing a few KiB for its quantized activations
// and its norm's or gate's rows. Allocated and freed on the heap each time
// (64-byte aligned, glibc's memalign path), they were ~2-4 % of the step's
// samples, on the calling thread, while the other threads waited
// (docs/quantized-weights.md, "A decode step's buffers").
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cpu/uninitialized_buffer.h"

namespace snapserve::kernels::cpu {

// `bytes` uninitialized bytes on a 64-byte boundary, for as long as the
// object lives. A thread has kThreadScratchSlots slots; a request of at most
// kThreadScratchKeptBytes through a slot no other live ThreadScratch of this
// thread holds reuses the slot's memory (grown to the largest such request,
// kept until the thread ends). Anything else (a larger request, a slot in
// use) gets its own heap memory, freed with the object: correct, as before,
// only slower.
inline constexpr int kThreadScratchSlots = 2;
inline constexpr int64_t kThreadScratchKeptBytes = int64_t{2} << 20;

class ThreadScratch {
 public:
  ThreadScratch(int slot, int64_t bytes);
  ~ThreadScratch();
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;

  uint8_t* get() const { return data_; }
  // Whether this object reuses the thread's slot (for tests).
  bool reused_slot() const { return slot_ >= 0; }

 private:
  uint8_t* data_ = nullptr;
  int slot_ = -1;  // the slot held, or -1
  std::unique_ptr<UninitializedBuffer<uint8_t>> own_;
};

}  // namespace snapserve::kernels::cpu
