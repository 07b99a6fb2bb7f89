#include "kernels/checks.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace snapserve::kernels {

namespace {
std::string describe(std::initializer_list<int64_t> sizes) {
  std::ostringstream out;
  out << "[";
  bool first = true;
  for (int64_t s : sizes) {
    out << (first ? "" : ", ") << (s < 0 ? std::string("*") : std::to_string(s));
    first = false;
  }
  out << "]";
  return out.str();
}
}  // namespace

void check_shape(const at::Tensor& t, std::string_view name, std::initializer_list<int64_t> sizes) {
  TORCH_CHECK(t.defined(), name, ": tensor is undefined");
  bool ok = t.dim() == static_cast<int64_t>(sizes.size());
  int64_t i = 0;
  for (int64_t s : sizes) {
    if (!ok) break;
    ok = s < 0 || t.size(i) == s;
    ++i;
  }
  TORCH_CHECK(ok, name, ": expected shape ", describe(sizes), ", got ", t.sizes());
}

void check_float_dtype(const at::Tensor& t, std::string_view name) {
  const auto dt = t.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, name,
              ": expected float32, bfloat16 or float16, got ", dt);
}

void check_same_device(const at::Tensor& t, std::string_view name, const at::Tensor& like) {
  TORCH_CHECK(t.device() == like.device(), name, ": expected device ", like.device(), ", got ",
              t.device());
}

}  // namespace snapserve::kernels
