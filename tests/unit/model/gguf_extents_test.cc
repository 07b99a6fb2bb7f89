// The arithmetic behind GgufFile's tensor-table checks, on hand-made extents:
// sizes from block layouts (with overflow), and the tiling of the data section.
#include "engine/model/gguf_extents.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace snapserve::model {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(GgufExtentsTest, CheckedMulDetectsOverflow) {
  EXPECT_EQ(CheckedMul(3, 5), 15u);
  EXPECT_EQ(CheckedMul(uint64_t{1} << 32, uint64_t{1} << 31), uint64_t{1} << 63);
  EXPECT_EQ(CheckedMul(uint64_t{1} << 32, uint64_t{1} << 32), std::nullopt);
  EXPECT_EQ(CheckedMul(UINT64_MAX, 0), 0u);
}

TEST(GgufExtentsTest, TensorByteSizeFromBlocks) {
  std::string why;
  // Q4_1: 32 elements in 20 bytes; 576 x 1536 as SmolLM2's ffn_down.
  EXPECT_EQ(TensorByteSize({1536, 576}, 32, 20, &why), 1536u / 32 * 20 * 576);
  EXPECT_EQ(TensorByteSize({576}, 1, 4, &why), 2304u);  // F32 vector
  EXPECT_EQ(TensorByteSize({}, 1, 4, &why), 4u);        // a scalar
  EXPECT_EQ(TensorByteSize({64, 0}, 32, 18, &why), 0u);
}

TEST(GgufExtentsTest, TensorByteSizeRefusesImpossibleShapes) {
  std::string why;
  EXPECT_EQ(TensorByteSize({576, 10}, 256, 144, &why), std::nullopt);  // Q4_K row of 576
  EXPECT_TRUE(Contains(why, "ne[0]=576, not a multiple of its block size 256")) << why;
  EXPECT_EQ(TensorByteSize({32, -1}, 32, 18, &why), std::nullopt);
  EXPECT_TRUE(Contains(why, "negative")) << why;
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(TensorByteSize({big, big}, 1, 4, &why), std::nullopt);
  EXPECT_TRUE(Contains(why, "overflows")) << why;
  // Elements fit, bytes do not.
  EXPECT_EQ(TensorByteSize({int64_t{1} << 62}, 1, 8, &why), std::nullopt);
  EXPECT_TRUE(Contains(why, "byte count overflows")) << why;
}

TEST(GgufExtentsTest, AcceptsTiledTensorsWithPadding) {
  // 40 bytes, padded to 64; then 20 bytes, with or without padding after.
  std::vector<TensorExtent> e = {{"b", 64, 20}, {"a", 0, 40}};
  EXPECT_TRUE(CheckTensorExtents(e, 84, 32, true).ok());
  EXPECT_TRUE(CheckTensorExtents(e, 96, 32, true).ok());
  EXPECT_TRUE(CheckTensorExtents({}, 0, 32, true).ok());
}

TEST(GgufExtentsTest, RefusesExtentPastTheSection) {
  Status s = CheckTensorExtents({{"a", 0, 40}, {"b", 64, 33}}, 96, 32, true);
  EXPECT_TRUE(Contains(s.message(), "tensor 'b' extends past end of file")) << s.message();
  // An offset near 2^64 must not wrap around when added to the size.
  s = CheckTensorExtents({{"a", UINT64_MAX - 31, 64}}, 96, 32, false);
  EXPECT_TRUE(Contains(s.message(), "tensor 'a' extends past end of file")) << s.message();
}

TEST(GgufExtentsTest, RefusesOverlapNamingBothTensors) {
  // As when a's type grows from Q4_0 (18 bytes a block) to Q8_0 (34).
  Status s = CheckTensorExtents({{"a", 0, 68}, {"b", 64, 32}}, 96, 32, false);
  EXPECT_TRUE(Contains(s.message(), "tensor 'a' (bytes [0, 68)) overlaps tensor 'b'"))
      << s.message();
  s = CheckTensorExtents({{"a", 0, 32}, {"b", 0, 32}}, 64, 32, false);
  EXPECT_TRUE(Contains(s.message(), "overlaps")) << s.message();
}

TEST(GgufExtentsTest, RefusesGapsWhenTilingIsExpected) {
  // As when a's type shrinks from Q4_1 (20 bytes a block) to Q4_0 (18).
  std::vector<TensorExtent> e = {{"a", 0, 90}, {"b", 128, 32}};
  Status s = CheckTensorExtents(e, 160, 32, true);
  EXPECT_TRUE(Contains(s.message(), "32 bytes before tensor 'b'")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "tensor 'a'")) << s.message();
  EXPECT_TRUE(CheckTensorExtents(e, 160, 32, /*expect_tiling=*/false).ok());
  s = CheckTensorExtents({{"a", 32, 32}}, 64, 32, true);
  EXPECT_TRUE(Contains(s.message(), "first tensor")) << s.message();
  s = CheckTensorExtents({{"a", 0, 32}}, 128, 32, true);
  EXPECT_TRUE(Contains(s.message(), "96 bytes after the last tensor")) << s.message();
}

TEST(GgufExtentsTest, BoundsLongNames) {
  const std::string name(5000, 'x');
  Status s = CheckTensorExtents({{name, 0, 64}}, 32, 32, false);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(s.message().size(), 300u) << s.message();
}

}  // namespace
}  // namespace snapserve::model
