// GGUF (ggml) quantized block formats, decoded to float32.
//
// A quantized matrix row of K elements is K / block_elements blocks laid end
// to end; each block carries its own scale(s) and small integers. The model
// keeps GGUF weights in these blocks (kernels/quant/quant_matrix.h) and decodes a
// few rows at a time right before they are used (kernels/linear/linear.h), so a
// decode step reads the file's 4-6 bits per weight from memory instead of 32.
//
// Decoding is bit-identical to the `gguf` Python package's
// gguf.quants.dequantize (which transformers uses to load GGUF files): the
// same float32 operations in the same order, never fused into FMAs. That is
// what lets the model's logits match transformers on the same file, and it is
// checked in tests/python/test_quant_blocks.py on random blocks of every type.
// Layouts: docs/quantized-weights.md.
#pragma once

#include <cstdint>
#include <optional>

namespace snapserve::kernels {

// The ggml type ids of the block formats kept quantized (ggml.h numbering, as
// stored in a GGUF tensor's info).
enum class QuantType : uint32_t {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
};

// How the linear multiplies GGUF blocks at decode-sized batches
// (kernels/linear/linear.h):
enum class QuantDot {
  // Each weight row decoded to exactly the float32 values
  // gguf.quants.dequantize gives, then used as a float32 row would be: the
  // result equals the float32 linear on the decoded weights bit for bit.
  kExact,
  // Activations quantized per 32-block to int8 and integer block dot products
  // (kernels/quant_dot/quant_dot.h), as llama.cpp computes these formats: fewer
  // instructions per weight at batch 1. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; the
  // K-quants use kExact.
  kInt8,
};

struct QuantFormat {
  int64_t block_elements;  // weights per block (32, or 256 for the K-quants)
  int64_t block_bytes;
  const char* name;  // "Q4_1", as ggml and llama.cpp write it
};

// The type for a ggml type id, or nullopt when it is not a supported block format.
std::optional<QuantType> quant_type_from_ggml(uint32_t ggml_type);

const QuantFormat& quant_format(QuantType type);

// Decodes `elements` weights (a multiple of the block size) from `src` into
// `dst`, on the SIMD path cpu_isa() picks (every path gives the same bits).
void dequantize_row(QuantType type, const uint8_t* src, int64_t elements, float* dst);

namespace cpu {
// The portable decoders, and the AVX2 ones (quant_blocks_cpu_avx2_nocontract.cc), which
// return false for a type they do not have so the caller falls back.
void dequantize_row_portable(QuantType type, const uint8_t* src, int64_t blocks, float* dst);
bool dequantize_row_avx2(QuantType type, const uint8_t* src, int64_t blocks, float* dst);
}  // namespace cpu

}  // namespace snapserve::kernels
