#include "engine/common/reusing_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <unordered_map>

namespace snapserve {

namespace {

// Sizes are rounded up to this so that a step's buffers of nearly equal
// sizes share blocks.
constexpr size_t kGranularity = size_t{64} << 10;

class ReusingCpuAllocator final : public c10::Allocator {
 public:
  explicit ReusingCpuAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < kMinCachedBytes) return fallback_->allocate(nbytes);
    const size_t want = (nbytes + kGranularity - 1) / kGranularity * kGranularity;
    void* data = TakeCached(want);
    if (data == nullptr) {
      data = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      // Out of address space or memory: the default allocator reports it
      // the way LibTorch always has.
      if (data == MAP_FAILED) return fallback_->allocate(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      live_.emplace(data, want);
    }
    // The context is the address itself, as LibTorch's raw_allocate and
    // raw_deallocate (used by oneDNN's GEMMs) require.
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }

  // Also frees what the default allocator handed out below kMinCachedBytes
  // when it comes back through raw_deallocate.
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  size_t Release() {
    std::multimap<size_t, void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      cached_bytes_ = 0;
    }
    size_t bytes = 0;
    for (const auto& [size, data] : blocks) {
      munmap(data, size);
      bytes += size;
    }
    return bytes;
  }

  size_t Cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

 private:
  static void Free(void* ctx);

  // The smallest cached block of at least `want` bytes and at most a quarter
  // more, moved to the live blocks; nullptr when none fits.
  void* TakeCached(size_t want) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(want);
    if (it == free_.end() || it->first > want + want / 4) return nullptr;
    void* data = it->second;
    cached_bytes_ -= it->first;
    live_.emplace(data, it->first);
    free_.erase(it);
    return data;
  }

  c10::Allocator* fallback_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // mapped blocks in use, by address
  std::multimap<size_t, void*> free_;       // cached blocks by size, for best fit
  size_t cached_bytes_ = 0;
};

// Never destroyed: tensors may be freed during static destruction.
ReusingCpuAllocator* Instance() {
  static auto* instance = new ReusingCpuAllocator(c10::GetDefaultCPUAllocator());
  return instance;
}

void ReusingCpuAllocator::Free(void* data) {
  ReusingCpuAllocator* self = Instance();
  size_t bytes = 0;
  bool kept = false;
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    auto it = self->live_.find(data);
    if (it != self->live_.end()) {
      bytes = it->second;
      self->live_.erase(it);
      if (self->cached_bytes_ + bytes <= kMaxCachedBytes) {
        self->free_.emplace(bytes, data);
        self->cached_bytes_ += bytes;
        kept = true;
      }
    }
  }
  if (bytes == 0) {
    self->fallback_->raw_deleter()(data);  // not ours: a small buffer of the default allocator
  } else if (!kept) {
    munmap(data, bytes);
  }
}

}  // namespace

void InstallReusingCpuAllocator() {
#if !defined(__SANITIZE_ADDRESS__)
  static std::once_flag once;
  // Priority 1: above the default CPU allocator's registration.
  std::call_once(once, [] { c10::SetCPUAllocator(Instance(), /*priority=*/1); });
#endif
  // Under AddressSanitizer the buffers stay with malloc, whose blocks ASan
  // fences: blocks mapped here would hide an overflow of a large buffer from
  // scripts/sanitize-e2e.sh.
}

size_t ReleaseCachedCpuBuffers() { return Instance()->Release(); }

size_t CachedCpuBufferBytes() { return Instance()->Cached(); }

}  // namespace snapserve
