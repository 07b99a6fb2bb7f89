// A kernel's scratch array: n elements left uninitialized (every element is
// written before it is read, and zeroing megabytes serially cost 1-2 % of a
// prefill), on a 64-byte boundary, so that each 64-byte row of a tile or a
// zmm register sits in one cache line. new[] aligns to 16 bytes only: every
// such row then straddles two lines, and each load costs two
// (docs/quantized-weights.md, "Prompt attention"). Internal to kernels/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace snapserve::kernels::cpu {

template <typename T>
class UninitializedBuffer {
 public:
  static constexpr std::align_val_t kAlignment{64};

  explicit UninitializedBuffer(int64_t n)
      : data_(static_cast<T*>(::operator new[](static_cast<size_t>(n) * sizeof(T), kAlignment))) {}
  T* get() const { return data_.get(); }

 private:
  struct Delete {
    void operator()(T* p) const { ::operator delete[](p, kAlignment); }
  };
  std::unique_ptr<T[], Delete> data_;
};

}  // namespace snapserve::kernels::cpu
