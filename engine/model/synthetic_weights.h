// Synthetic models: the shapes of a real model (a small table of presets
// written here) with seeded random weights in a chosen format, so that the
// throughput of models nobody downloaded can be measured, on CPU and on a GPU.
// The outputs mean nothing; the work per token is the real model's.
//
// A model path `synthetic:<preset>[?format=<f>][&seed=<n>]` (LoadModel,
// llama_model.h), e.g. `synthetic:llama-3.2-1b?format=q4_k&seed=7`.
//   preset  smollm2-135m, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, mistral-7b
//   format  f32 | bf16 | f16 (dense) or q8_0 | q4_0 | q4_1 | q5_0 | q5_1 |
//           q4_k | q5_k | q6_k (GGUF blocks, kept as blocks on CPU exactly
//           like a GGUF file's, kernels/quant/quant_matrix.h). Default q8_0.
//   seed    an unsigned 64-bit integer, default 0.
// Every matrix (embedding and LM head included) gets the format; norm weights
// are 1.0. A K-quant needs rows of whole 256-element super-blocks; a matrix
// whose row length is not falls back as llama.cpp's quantizer does
// (llama-quant.cpp: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), e.g. every
// matrix of SmolLM2 (hidden 576) but down_proj. No tokenizer comes with it.
//
// Values: each tensor's generator is seeded by mix(seed, FNV-1a of its HF
// name), then per chunk of the tensor (so the bytes do not depend on the
// thread count): the same spec gives the same model, bit for bit. Dense
// matrices are ~N(0, 0.02) (an Irwin-Hall approximation, kernels/quant/random_blocks.h),
// rounded to the format and stored in the model dtype, as a GGUF F16 tensor
// is. Block matrices are random bytes whose float16 scales are ~N(0, s), s
// chosen per block type so that the decoded weights also have an RMS of ~0.02.
// Each tensor is allocated once, at its final size, and filled in place.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "engine/common/status_or.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "kernels/quant/quant_blocks.h"

namespace snapserve::model {

struct SyntheticSpec {
  std::string preset;
  std::string format = "q8_0";
  uint64_t seed = 0;
  ModelConfig config;  // the preset's

  // The block type of a matrix with `cols` columns (after the K-quant
  // fallback), or nullopt for a dense format.
  std::optional<kernels::QuantType> BlockType(int64_t cols) const;
  // kFloat, kBFloat16 or kHalf for a dense format.
  std::optional<at::ScalarType> DenseType() const;
};

// True when `path` starts with "synthetic:".
bool IsSyntheticSpec(const std::string& path);

// Parses a spec; InvalidArgument naming the presets or formats otherwise.
StatusOr<SyntheticSpec> ParseSyntheticSpec(const std::string& spec);

std::unique_ptr<WeightSource> OpenSyntheticWeights(const SyntheticSpec& spec);

// Bytes of weight matrices a decode step reads on CPU for a model of `dtype`:
// every layer's q/k/v, o, gate/up and down, and the LM head (the embedding
// only through the LM head when tied: the lookup reads a few rows).
int64_t SyntheticDecodeBytes(const SyntheticSpec& spec, at::ScalarType dtype);

}  // namespace snapserve::model
