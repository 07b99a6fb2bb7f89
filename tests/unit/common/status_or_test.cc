#include "engine/common/status_or.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace snapserve {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

// Declares the variable it assigns.
StatusOr<int> Quarter(int x) {
  SNAPSERVE_ASSIGN_OR_RETURN(int half, Half(x));
  SNAPSERVE_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

// Assigns an existing variable; the enclosing function returns a Status.
Status HalveInPlace(int* x, int* calls_after) {
  SNAPSERVE_ASSIGN_OR_RETURN(*x, Half(*x));
  ++*calls_after;
  return Status::Ok();
}

StatusOr<std::unique_ptr<std::string>> MakeText(bool ok) {
  if (!ok) return Status::NotFound("no text");
  return std::make_unique<std::string>("text");
}

// Move-only values are moved out of the StatusOr.
StatusOr<size_t> TextLength(bool ok) {
  SNAPSERVE_ASSIGN_OR_RETURN(std::unique_ptr<std::string> text, MakeText(ok));
  return text->size();
}

TEST(StatusOrTest, HoldsAValueOrAStatus) {
  StatusOr<int> v = Half(4);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2);
  StatusOr<int> e = Half(3);
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

TEST(StatusOrTest, AssignOrReturnDeclaresAndAssigns) {
  StatusOr<int> q = Quarter(12);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(*q, 3);
}

TEST(StatusOrTest, AssignOrReturnReturnsTheFirstError) {
  StatusOr<int> first = Quarter(3);  // fails in the first call
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().message(), "odd: 3");
  StatusOr<int> second = Quarter(6);  // 6 -> 3, fails in the second call
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), "odd: 3");
}

TEST(StatusOrTest, AssignOrReturnInAStatusFunction) {
  int x = 8;
  int after = 0;
  EXPECT_TRUE(HalveInPlace(&x, &after).ok());
  EXPECT_EQ(x, 4);
  EXPECT_EQ(after, 1);

  x = 5;
  const Status s = HalveInPlace(&x, &after);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(x, 5);      // untouched
  EXPECT_EQ(after, 1);  // the rest of the function did not run
}

TEST(StatusOrTest, AssignOrReturnMovesMoveOnlyValues) {
  StatusOr<size_t> n = TextLength(true);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  StatusOr<size_t> missing = TextLength(false);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace snapserve
