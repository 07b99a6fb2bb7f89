// A test fixture whose tests run with LibTorch's intra-op pool at two
// threads (whatever the machine has), restored afterwards: the parallel
// loops' tests need a second thread to take work.
#pragma once

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

namespace snapserve::kernels {

class TwoThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();
    at::set_num_threads(2);
  }
  void TearDown() override { at::set_num_threads(threads_); }

 private:
  int threads_ = 1;
};

}  // namespace snapserve::kernels
