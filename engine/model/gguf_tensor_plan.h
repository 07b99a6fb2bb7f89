// The tensor table a Llama-architecture GGUF file must have for a config:
// every tensor the forward pass reads, by its GGUF name, with the exact shape
// the config implies and a type the loader can decode, and nothing else. A
// file whose metadata and tensors disagree (block_count lowered, a tensor
// renamed, reshaped or left over from another model) is refused here, before
// any weight is read, instead of being served as a model that answers
// garbage. Knows names, shapes and type ids only: no LibTorch, no file I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/model/gguf_file.h"
#include "engine/model/model_config.h"

namespace snapserve::model {

enum class GgufTensorRole {
  kMatrix,  // a linear layer or the embedding: any type the loader decodes
  kVector,  // a norm weight or rope_freqs: float types only (never blocks)
};

struct ExpectedGgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the row length
  GgufTensorRole role;
  bool required;
};

// What `config` calls for. `output.weight` is optional (absent: the
// embedding is tied), `rope_freqs.weight` too (present: the config holds its
// values); everything else is required.
std::vector<ExpectedGgufTensor> ExpectedGgufTensors(const ModelConfig& config);

// OK when the file holds exactly the tensors ExpectedGgufTensors lists
// (optional ones may be absent), each with its shape and a type its role
// accepts. Errors name the file and the tensor.
Status CheckGgufTensorTable(const GgufFile& file, const ModelConfig& config);

}  // namespace snapserve::model
