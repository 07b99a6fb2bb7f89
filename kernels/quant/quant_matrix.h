// A weight matrix kept in a GGUF block format (quant_blocks.h): each of its
// `rows` rows is cols / block_elements blocks, rows laid end to end exactly
// as in the file. The CPU linear (kernels/linear/linear.h) decodes rows as it uses
// them; nothing is widened at load.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/quant/quant_blocks.h"

namespace snapserve::kernels {

struct QuantMatrix {
  QuantType type = QuantType::kQ8_0;
  int64_t rows = 0, cols = 0;
  at::Tensor data;  // uint8 [rows, row_bytes()], CPU, contiguous
  // data's first byte and row size, fixed by make_quant_matrix: the kernels
  // ask for a row address per weight row, too often to check the tensor each time.
  const uint8_t* base = nullptr;
  int64_t stride = 0;

  int64_t row_bytes() const { return stride; }
  const uint8_t* row(int64_t r) const { return base + r * stride; }
  // Bytes held in memory (what a decode step reads of this matrix).
  int64_t nbytes() const { return rows * row_bytes(); }
};

// Checks cols is a whole number of blocks and data is uint8 [rows, row_bytes]
// on CPU and contiguous; throws c10::Error naming `name` otherwise.
QuantMatrix make_quant_matrix(QuantType type, int64_t rows, int64_t cols, at::Tensor data,
                              const char* name = "weight");

// Rows stacked: a and b must share type and cols (q, k, v into one matrix).
QuantMatrix concat_rows(const std::vector<QuantMatrix>& parts);

// The whole matrix as float32 [rows, cols].
at::Tensor dequantize(const QuantMatrix& w);

// Rows `ids` (int64, any shape) as float32 [ids..., cols]: an embedding lookup.
at::Tensor dequantize_rows(const QuantMatrix& w, const at::Tensor& ids);

}  // namespace snapserve::kernels
