// Shape and dtype checks shared by every op in kernels/. Ops validate their
// inputs with these before dispatching to a CPU or CUDA implementation, so a
// wrong shape fails with a message naming the argument instead of crashing
// inside a kernel. Failures throw c10::Error (TORCH_CHECK); the engine turns
// them into a Status at its boundary.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string_view>

namespace snapserve::kernels {

// Checks `t` has `dims` dimensions; each expected size of -1 matches any size.
void check_shape(const at::Tensor& t, std::string_view name, std::initializer_list<int64_t> sizes);

// Checks `t` is float32, bfloat16 or float16 (the dtypes the kernels support).
void check_float_dtype(const at::Tensor& t, std::string_view name);

// Checks `t` lives on the same device as `like`.
void check_same_device(const at::Tensor& t, std::string_view name, const at::Tensor& like);

}  // namespace snapserve::kernels
