// kernels/cpu/thread_scratch.h.
#include "kernels/cpu/thread_scratch.h"

#include <c10/util/Exception.h>

#include <array>

namespace snapserve::kernels::cpu {

namespace {

struct Slot {
  std::unique_ptr<UninitializedBuffer<uint8_t>> memory;
  int64_t bytes = 0;
  bool in_use = false;
};

thread_local std::array<Slot, kThreadScratchSlots> slots;

}  // namespace

ThreadScratch::ThreadScratch(int slot, int64_t bytes) {
  TORCH_CHECK(slot >= 0 && slot < kThreadScratchSlots, "ThreadScratch: slot ", slot,
              " out of range");
  Slot& s = slots[static_cast<size_t>(slot)];
  if (s.in_use || bytes > kThreadScratchKeptBytes) {
    own_ = std::make_unique<UninitializedBuffer<uint8_t>>(bytes);
    data_ = own_->get();
    return;
  }
  if (s.bytes < bytes) {
    s.memory = std::make_unique<UninitializedBuffer<uint8_t>>(bytes);
    s.bytes = bytes;
  }
  s.in_use = true;
  slot_ = slot;
  data_ = s.memory->get();
}

ThreadScratch::~ThreadScratch() {
  if (slot_ >= 0) slots[static_cast<size_t>(slot_)].in_use = false;
}

}  // namespace snapserve::kernels::cpu
