// GGUF block decoders and the linear over quantized weights, on the SIMD path
// this process runs (ctest runs this file on every path the CPU has,
// kernels/CMakeLists.txt): each path decodes exactly as the portable decoder
// does, and the portable decoder is checked against gguf-py, the oracle, in
// tests/python/test_quant_blocks.py.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/linear/linear.h"
#include "kernels/quant/quant_blocks.h"
#include "kernels/quant/quant_matrix.h"
#include "kernels/quant/random_blocks.h"
#include "kernels/quant_dot/quant_dot.h"

namespace snapserve::kernels {
namespace {

struct TypeCase {
  QuantType type;
};

const std::vector<TypeCase>& Types() {
  static const std::vector<TypeCase> kTypes = {
      {QuantType::kQ4_0}, {QuantType::kQ4_1}, {QuantType::kQ5_0}, {QuantType::kQ5_1},
      {QuantType::kQ8_0}, {QuantType::kQ2_K}, {QuantType::kQ3_K}, {QuantType::kQ4_K},
      {QuantType::kQ5_K}, {QuantType::kQ6_K},
  };
  return kTypes;
}

// Random bytes with finite float16 scales: valid blocks of any type.
at::Tensor RandomBlocks(const TypeCase& c, int64_t rows, int64_t blocks_per_row, uint32_t seed) {
  const QuantFormat& f = quant_format(c.type);
  at::Tensor data = at::empty({rows, blocks_per_row * f.block_bytes}, at::kByte);
  random_blocks(c.type, seed, 0.05f, rows * blocks_per_row, data.data_ptr<uint8_t>());
  return data;
}

class QuantBlocksTest : public ::testing::TestWithParam<size_t> {
 protected:
  const TypeCase& Case() const { return Types()[GetParam()]; }
};

TEST_P(QuantBlocksTest, ThisPathDecodesAsThePortableDecoder) {
  const TypeCase& c = Case();
  const QuantFormat& f = quant_format(c.type);
  const at::Tensor data = RandomBlocks(c, 3, 5, 7 + static_cast<uint32_t>(GetParam()));
  const int64_t cols = 5 * f.block_elements;
  const at::Tensor got = dequantize(make_quant_matrix(c.type, 3, cols, data));
  std::vector<float> want(static_cast<size_t>(3 * cols));
  cpu::dequantize_row_portable(c.type, data.const_data_ptr<uint8_t>(), 15, want.data());
  ASSERT_EQ(std::memcmp(got.const_data_ptr<float>(), want.data(), want.size() * 4), 0) << f.name;
  EXPECT_TRUE(at::isfinite(got).all().item<bool>()) << f.name;
}

TEST_P(QuantBlocksTest, LinearEqualsFloat32LinearOnDecodedWeights) {
  const TypeCase& c = Case();
  const QuantFormat& f = quant_format(c.type);
  const int64_t cols = 512;
  const QuantMatrix w =
      make_quant_matrix(c.type, 13, cols, RandomBlocks(c, 13, cols / f.block_elements, 99), "w");
  const at::Tensor dense = dequantize(w);
  at::manual_seed(3);
  for (int64_t m : {1, 2, 5, 16, 64, 65}) {
    const at::Tensor x = at::randn({m, cols});
    EXPECT_TRUE(at::equal(linear_quantized(x, w), linear_float32(x, dense)))
        << f.name << " m=" << m;
  }
}

TEST_P(QuantBlocksTest, RowResultIndependentOfBatch) {
  const TypeCase& c = Case();
  const QuantFormat& f = quant_format(c.type);
  const QuantMatrix w =
      make_quant_matrix(c.type, 9, 256, RandomBlocks(c, 9, 256 / f.block_elements, 5), "w");
  at::manual_seed(4);
  const at::Tensor x = at::randn({16, 256});
  const at::Tensor batched = linear_quantized(x, w);
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_TRUE(at::equal(batched[i], linear_quantized(x.narrow(0, i, 1), w)[0])) << i;
  }
}

TEST_P(QuantBlocksTest, Int8DotOnThisPathEqualsPortable) {
  const TypeCase& c = Case();
  const QuantFormat& f = quant_format(c.type);
  // 18 legacy blocks per row: two full eight-block steps of the SIMD path and
  // a partial one (its masked lanes must add nothing).
  const int64_t cols = f.block_elements == 32 ? 576 : 512;
  const QuantMatrix w =
      make_quant_matrix(c.type, 11, cols, RandomBlocks(c, 11, cols / f.block_elements, 8), "w");
  at::manual_seed(6);
  for (int64_t m : {1, 3, 4, 7, 16}) {
    const at::Tensor x = at::randn({m, cols});
    const at::Tensor got = linear_quantized(x, w, QuantDot::kInt8);
    if (!has_int8_dot(c.type)) {
      // The K-quants have no int8 dot here: kInt8 falls back to exact.
      EXPECT_TRUE(at::equal(got, linear_quantized(x, w, QuantDot::kExact))) << f.name;
      continue;
    }
    const cpu::QuantizedRows xq = cpu::quantize_rows(x.const_data_ptr<float>(), m, cols);
    std::vector<float> portable(static_cast<size_t>(m * 11));
    cpu::int8_dot_portable(w, xq, 0, 11, portable.data(), 11);
    EXPECT_EQ(std::memcmp(got.const_data_ptr<float>(), portable.data(), portable.size() * 4), 0)
        << f.name << " m=" << m;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantBlocksTest, ::testing::Range<size_t>(0, 10),
                         [](const auto& info) {
                           return std::string(quant_format(Types()[info.param].type).name);
                         });

TEST(QuantMatrixTest, RejectsRowsThatAreNotWholeBlocks) {
  try {
    make_quant_matrix(QuantType::kQ4_K, 2, 576, at::zeros({2, 324}, at::kByte), "blk.0.ffn_up");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("blk.0.ffn_up"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Q4_K"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_quant_matrix(QuantType::kQ8_0, 2, 64, at::zeros({2, 67}, at::kByte)),
               c10::Error);
}

TEST(QuantMatrixTest, EmbeddingLookupChecksIds) {
  const QuantMatrix w = make_quant_matrix(QuantType::kQ8_0, 4, 32, at::zeros({4, 34}, at::kByte));
  EXPECT_EQ(dequantize_rows(w, at::tensor({3, 0}, at::kLong)).sizes(), (at::IntArrayRef{2, 32}));
  EXPECT_THROW(dequantize_rows(w, at::tensor({4}, at::kLong)), c10::Error);
  EXPECT_THROW(dequantize_rows(w, at::tensor({-1}, at::kLong)), c10::Error);
}

TEST(QuantMatrixTest, ConcatRowsKeepsOrder) {
  const TypeCase& c = Types()[1];  // Q4_1
  const QuantMatrix a = make_quant_matrix(c.type, 2, 64, RandomBlocks(c, 2, 2, 1));
  const QuantMatrix b = make_quant_matrix(c.type, 3, 64, RandomBlocks(c, 3, 2, 2));
  const QuantMatrix ab = concat_rows({a, b});
  EXPECT_EQ(ab.rows, 5);
  EXPECT_TRUE(at::equal(dequantize(ab), at::cat({dequantize(a), dequantize(b)}, 0)));
}

}  // namespace
}  // namespace snapserve::kernels
