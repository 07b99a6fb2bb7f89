#include "kernels/quant/quant_matrix.h"
#include "kernels/cpu/parallel_team.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <vector>

namespace snapserve::kernels {

QuantMatrix make_quant_matrix(QuantType type, int64_t rows, int64_t cols, at::Tensor data,
                              const char* name) {
  const QuantFormat& f = quant_format(type);
  TORCH_CHECK(rows >= 0 && cols > 0 && cols % f.block_elements == 0, name, ": ", f.name,
              " rows of ", cols, " elements are not a whole number of ", f.block_elements,
              "-element blocks");
  QuantMatrix m{type, rows, cols, std::move(data)};
  m.stride = cols / f.block_elements * f.block_bytes;
  TORCH_CHECK(m.data.scalar_type() == at::kByte && m.data.is_cpu() && m.data.is_contiguous() &&
                  m.data.dim() == 2 && m.data.size(0) == rows && m.data.size(1) == m.row_bytes(),
              name, ": expected contiguous CPU uint8 [", rows, ", ", m.row_bytes(),
              "] blocks, got ", m.data.scalar_type(), " ", m.data.sizes());
  m.base = m.data.const_data_ptr<uint8_t>();
  return m;
}

QuantMatrix concat_rows(const std::vector<QuantMatrix>& parts) {
  TORCH_CHECK(!parts.empty(), "concat_rows: no parts");
  std::vector<at::Tensor> data;
  int64_t rows = 0;
  for (const QuantMatrix& p : parts) {
    TORCH_CHECK(p.type == parts[0].type && p.cols == parts[0].cols,
                "concat_rows: parts differ in type or width");
    data.push_back(p.data);
    rows += p.rows;
  }
  return make_quant_matrix(parts[0].type, rows, parts[0].cols, at::cat(data, 0));
}

at::Tensor dequantize(const QuantMatrix& w) {
  at::Tensor out = at::empty({w.rows, w.cols}, at::kFloat);
  float* dst = out.data_ptr<float>();
  cpu::parallel_for(0, w.rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      dequantize_row(w.type, w.row(r), w.cols, dst + r * w.cols);
  });
  return out;
}

at::Tensor dequantize_rows(const QuantMatrix& w, const at::Tensor& ids) {
  const at::Tensor flat = ids.to(at::kLong).contiguous().view({-1});
  const int64_t n = flat.numel();
  const int64_t* id = flat.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < w.rows, "row id ", id[i], " out of range [0, ", w.rows, ")");
  }
  at::Tensor out = at::empty({n, w.cols}, at::kFloat);
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) dequantize_row(w.type, w.row(id[i]), w.cols, dst + i * w.cols);
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(w.cols);
  return out.view(shape);
}

}  // namespace snapserve::kernels
