// Torch op for the CPU linear layer (kernels/linear.h), so
// benchmarks and tests can drive it from Python.
#include <torch/library.h>

#include "kernels/linear.h"

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("linear_float32(Tensor x, Tensor w) -> Tensor", &snapserve::kernels::linear_float32);
}
