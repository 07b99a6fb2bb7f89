// kernels/snapkv_select on tiny cases whose answers are derived by hand below,
// plus the argument checks. The big randomized comparison against the
// independent Python reference lives in tests/python/test_snapkv_reference.py.
#include "kernels/snapkv_select/snapkv_select.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace snapserve::kernels {
namespace {

// Keys of the hand cases: head_dim 1 (scale 1/sqrt(1) = 1), one KV head, n = 6.
at::Tensor HandKeys() { return at::tensor(std::vector<float>{0, 3, 0, 1, 2, 9}).view({1, 6, 1}); }

at::Tensor Queries(std::vector<float> values, int64_t heads, int64_t rows) {
  return at::tensor(values).view({heads, rows, 1});
}

std::vector<int64_t> Positions(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::vector<int64_t> Select(const at::Tensor& q, const at::Tensor& k, int64_t window,
                            int64_t capacity, int64_t kernel, PoolingKind pooling,
                            GroupReduce reduce = GroupReduce::kMean) {
  return Positions(snapkv_select(q, k, {window, capacity, kernel, pooling, reduce}));
}

// w = 1, q = [1]: the single window row (position 5) sees all six keys, so
// A[j] = e^key[j] / Z. Prefix (j < 5) scores s ∝ [e^0, e^3, e^0, e^1, e^2]
//                                                = [1, 20.09, 1, 2.72, 7.39].
TEST(SnapKvSelect, HandCaseNoPooling) {
  // k = 1, top C - w = 2: positions 1 (20.09) and 4 (7.39), then window 5.
  EXPECT_EQ(Select(Queries({1}, 1, 1), HandKeys(), 1, 3, 1, PoolingKind::kMax),
            (std::vector<int64_t>{1, 4, 5}));
}

TEST(SnapKvSelect, HandCaseMaxPoolTiesKeepLowerPosition) {
  // k = 3 max: p = [max(s0,s1), max(s0..s2), max(s1..s3), max(s2..s4), max(s3,s4)]
  //              = [20.09, 20.09, 20.09, 7.39, 7.39]. Three-way tie at the top:
  // the lower positions 0 and 1 win.
  EXPECT_EQ(Select(Queries({1}, 1, 1), HandKeys(), 1, 3, 3, PoolingKind::kMax),
            (std::vector<int64_t>{0, 1, 5}));
}

TEST(SnapKvSelect, HandCaseAvgPoolCountsPaddingAsZero) {
  // k = 3 avg (÷3, padding 0): p = [(0+1+20.09), (1+20.09+1), (20.09+1+2.72),
  //   (1+2.72+7.39), (2.72+7.39+0)] / 3 = [7.03, 7.36, 7.94, 3.70, 3.37].
  // Top 2: positions 2, 1; top 3 adds position 0.
  EXPECT_EQ(Select(Queries({1}, 1, 1), HandKeys(), 1, 3, 3, PoolingKind::kAvg),
            (std::vector<int64_t>{1, 2, 5}));
  EXPECT_EQ(Select(Queries({1}, 1, 1), HandKeys(), 1, 4, 3, PoolingKind::kAvg),
            (std::vector<int64_t>{0, 1, 2, 5}));
}

TEST(SnapKvSelect, HandCaseCausalMaskInsideWindow) {
  // w = 2, rows q = +1 (position 4: sees keys 0..4 only) and q = -1 (position 5).
  // Row 0: softmax of [0,3,0,1,2] -> [.031, .624, .031, .084, ...] (Z = 32.2).
  // Row 1: softmax of -[0,3,0,1,2,9] -> [.392, .020, .392, .144, ...] (Z = 2.55).
  // Prefix j < 4 sums: [.423, .644, .423, .229]; top 2 = 1, then the tie 0/2
  // goes to 0. Without the mask row 0 would see key 5 (e^9) and its share would
  // nearly vanish, giving [.392, .022, .392, .144] and positions {0, 2} instead.
  EXPECT_EQ(Select(Queries({1, -1}, 1, 2), HandKeys(), 2, 4, 1, PoolingKind::kMax),
            (std::vector<int64_t>{0, 1, 4, 5}));
}

TEST(SnapKvSelect, HandCaseGroupReduce) {
  // Two query heads share the KV head: head 0 (q = 1) as above, head 1 (q = 0)
  // attends uniformly, 1/6 = .167 to every key, far above head 0's
  // s = [1, 20.09, 1, 2.72, 7.39] / 8135 = [.0001, .0025, .0001, .0003, .0009].
  // Mean keeps head 0's order: {1, 4}. Max is 1/6 everywhere: all tie -> {0, 1}.
  const at::Tensor q = Queries({1, 0}, 2, 1);
  EXPECT_EQ(Select(q, HandKeys(), 1, 3, 1, PoolingKind::kMax, GroupReduce::kMean),
            (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(Select(q, HandKeys(), 1, 3, 1, PoolingKind::kMax, GroupReduce::kMax),
            (std::vector<int64_t>{0, 1, 5}));
}

TEST(SnapKvSelect, ReducedPrecisionInputsMatchFloat32) {
  // bf16/fp16 inputs are upcast exactly, so the same values select the same.
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    EXPECT_EQ(Positions(snapkv_select(Queries({1, -1}, 1, 2).to(dtype), HandKeys().to(dtype),
                                      {2, 4, 1, PoolingKind::kMax})),
              (std::vector<int64_t>{0, 1, 4, 5}));
  }
}

TEST(SnapKvSelect, ShapeAndOrderOnRandomInput) {
  at::manual_seed(0);
  const at::Tensor q = at::randn({6, 8, 16});
  const at::Tensor k = at::randn({2, 300, 16});
  const at::Tensor out = snapkv_select(q, k, {8, 40, 7, PoolingKind::kMax});
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{2, 40}));
  ASSERT_EQ(out.scalar_type(), at::kLong);
  for (int64_t g = 0; g < 2; ++g) {
    const std::vector<int64_t> row = Positions(out[g]);
    for (size_t t = 1; t < row.size(); ++t) EXPECT_LT(row[t - 1], row[t]);
    for (int64_t t = 0; t < 8; ++t) EXPECT_EQ(row[32 + t], 292 + t);
  }
}

TEST(SnapKvGather, CopiesKeptRowsBitForBit) {
  at::manual_seed(1);
  const at::Tensor src = at::randn({5, 2, 4}).to(at::kBFloat16).transpose(0, 1);  // strided
  const at::Tensor idx = at::tensor(std::vector<int64_t>{0, 3, 4, 1, 2, 4}).view({2, 3});
  const at::Tensor out = snapkv_gather(src, idx);
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{2, 3, 4}));
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_TRUE(at::equal(out[g][c], src[g][idx[g][c].item<int64_t>()]));
    }
  }
}

// Runs `fn`, expecting a c10::Error whose message contains `needle`.
template <typename Fn>
void ExpectError(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(SnapKvSelect, RejectsBadParameters) {
  const at::Tensor q = at::randn({4, 8, 16});
  const at::Tensor k = at::randn({2, 100, 16});
  ExpectError(
      [&] {
        snapkv_select(q, k, {8, 64, 4, PoolingKind::kMax});
      },
      "kernel_size must be odd and positive, got 4");
  ExpectError(
      [&] {
        snapkv_select(q, k, {0, 64, 7, PoolingKind::kMax});
      },
      "window must be at least 1, got 0");
  ExpectError(
      [&] {
        snapkv_select(q, k, {8, 8, 7, PoolingKind::kMax});
      },
      "window must be less than capacity (8 >= 8)");
  ExpectError(
      [&] {
        snapkv_select(q, k, {8, 100, 7, PoolingKind::kMax});
      },
      "capacity must be less than the prompt length n (100 >= 100)");
  ExpectError(
      [&] {
        snapkv_select(q, k, {4, 64, 7, PoolingKind::kMax});
      },
      "q_window: expected 4 rows");
}

TEST(SnapKvSelect, RejectsBadTensors) {
  const at::Tensor q = at::randn({4, 8, 16});
  const at::Tensor k = at::randn({2, 100, 16});
  const SnapKvParams p{8, 64, 7, PoolingKind::kMax};
  ExpectError([&] { snapkv_select(q.slice(0, 0, 3), k, p); },
              "num_heads (3) must be a positive multiple of num_kv_heads (2)");
  ExpectError([&] { snapkv_select(q, k.slice(2, 0, 8), p); }, "keys: head_dim must equal");
  ExpectError([&] { snapkv_select(q, k.to(at::kHalf), p); }, "keys: expected dtype");
  ExpectError([&] { snapkv_select(q.to(at::kDouble), k.to(at::kDouble), p); },
              "q_window: expected float32, bfloat16 or float16");
  ExpectError([&] { snapkv_select(q, k[0], p); }, "keys: expected shape");
  at::Tensor idx = at::zeros({2, 3}, at::kLong);
  ExpectError([&] { snapkv_gather(k, idx.to(at::kInt)); }, "indices: expected int64");
  idx[1][2] = -1;
  ExpectError([&] { snapkv_gather(k, idx); }, "position -1 at [1, 2] is outside [0, 100)");
}

}  // namespace
}  // namespace snapserve::kernels
