#include "engine/common/reusing_cpu_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace snapserve {
namespace {

// Float tensors of `bytes` bytes from LibTorch's CPU allocator.
at::Tensor Buffer(size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes / sizeof(float))}, at::kFloat);
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer the install leaves LibTorch's allocator in place,
// so that ASan keeps fencing large buffers: nothing is cached.
TEST(ReusingCpuAllocatorUnderAsanTest, InstallKeepsTheDefaultAllocator) {
  c10::Allocator* before = c10::GetCPUAllocator();
  InstallReusingCpuAllocator();
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  { at::Tensor a = Buffer(4 << 20); }
  EXPECT_EQ(CachedCpuBufferBytes(), 0u);
}
#else
class ReusingCpuAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallReusingCpuAllocator();
    ReleaseCachedCpuBuffers();
  }
};

TEST_F(ReusingCpuAllocatorTest, AFreedLargeBufferServesTheNextOfItsSize) {
  void* first = nullptr;
  {
    at::Tensor a = Buffer(4 << 20);
    first = a.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);  // LibTorch's alignment
    EXPECT_EQ(CachedCpuBufferBytes(), 0u);
  }
  EXPECT_EQ(CachedCpuBufferBytes(), size_t{4} << 20);
  at::Tensor b = Buffer((4 << 20) - 4096);  // rounds up to the same block
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(CachedCpuBufferBytes(), 0u);
}

TEST_F(ReusingCpuAllocatorTest, ReusedMemoryKeepsWhatWasWrittenLast) {
  at::Tensor a = Buffer(2 << 20);
  a.fill_(3.0f);
  a.fill_(7.0f);
  EXPECT_TRUE(at::all(a == 7.0f).item<bool>());
}

// oneDNN's GEMMs allocate through raw_allocate / raw_deallocate, which
// need the address itself as the context and a raw deleter for every size.
TEST_F(ReusingCpuAllocatorTest, RawAllocationsOfEverySizeComeBack) {
  c10::Allocator* a = c10::GetCPUAllocator();
  void* big = a->raw_allocate(size_t{3} << 20);
  void* small = a->raw_allocate(4096);
  ASSERT_NE(big, nullptr);
  ASSERT_NE(small, nullptr);
  a->raw_deallocate(small);
  EXPECT_EQ(CachedCpuBufferBytes(), 0u);
  a->raw_deallocate(big);
  EXPECT_EQ(CachedCpuBufferBytes(), size_t{3} << 20);
  EXPECT_EQ(a->raw_allocate(size_t{3} << 20), big);
  a->raw_deallocate(big);
}

TEST_F(ReusingCpuAllocatorTest, SmallBuffersStayWithTheDefaultAllocator) {
  { at::Tensor small = Buffer(kMinCachedBytes - 64); }
  EXPECT_EQ(CachedCpuBufferBytes(), 0u);
}

TEST_F(ReusingCpuAllocatorTest, AMuchLargerBlockIsNotHandedToASmallRequest) {
  void* big = nullptr;
  {
    at::Tensor a = Buffer(8 << 20);
    big = a.data_ptr();
  }
  // 2 MiB would waste 6 of the block's 8: it gets a block of its own, and
  // the 8 MiB one stays cached.
  at::Tensor b = Buffer(2 << 20);
  EXPECT_NE(b.data_ptr(), big);
  EXPECT_EQ(CachedCpuBufferBytes(), size_t{8} << 20);
  // Within a quarter above the request it is taken.
  at::Tensor c = Buffer(7 << 20);
  EXPECT_EQ(c.data_ptr(), big);
}

TEST_F(ReusingCpuAllocatorTest, TheCacheStaysWithinItsBoundAndReleaseEmptiesIt) {
  {
    std::vector<at::Tensor> many;
    many.reserve(12);
    // Mapped but never written: no memory is used for them.
    for (int i = 0; i < 12; ++i) many.push_back(Buffer(size_t{64} << 20));
  }
  EXPECT_LE(CachedCpuBufferBytes(), kMaxCachedBytes);
  EXPECT_GE(CachedCpuBufferBytes(), kMaxCachedBytes - (size_t{64} << 20));
  const size_t cached = CachedCpuBufferBytes();
  EXPECT_EQ(ReleaseCachedCpuBuffers(), cached);
  EXPECT_EQ(CachedCpuBufferBytes(), 0u);
}
#endif  // defined(__SANITIZE_ADDRESS__)

}  // namespace
}  // namespace snapserve
