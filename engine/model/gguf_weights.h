// GGUF -> the Hugging Face layout: the model config from `llama.*` metadata,
// the tensors (on CPU, matrices in a block format stay in their blocks,
// kernels/quant/quant_matrix.h; everything else, and everything on CUDA, is
// dequantized to float32 once at load), tensor renaming (blk.N.attn_q ->
// model.layers.N.self_attn.q_proj, ...), and undoing llama.cpp's q/k row permutation. The last
// matters: llama.cpp's converter reorders each head's q/k rows so RoPE rotates adjacent pairs (2i,
// 2i+1); transformers (and rope.h) rotate (i, i + head_dim/2). We invert it exactly as
// transformers' GGUF loader does, so the same file gives the same model in both.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "engine/common/status_or.h"
#include "engine/model/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace snapserve::model {

// Reads the `general.architecture` prefix's hyper-parameters (llama, mistral).
StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// float32 tensor in PyTorch order (GGUF dims reversed: [dims[n-1], ..., dims[0]]).
// F32, F16, BF16 and the block formats of kernels/quant/quant_blocks.h; other types
// are Unimplemented, naming the file, the tensor and the type.
StatusOr<at::Tensor> DequantizeGgufTensor(const GgufTensorInfo& tensor, const std::string& path);

// The GGUF name of an HF tensor name, or nullopt if it has none.
std::optional<std::string> GgufNameForHf(const std::string& hf_name);

// A WeightSource over an open GGUF file (shared: the caller may keep reading
// metadata, e.g. the tokenizer).
std::unique_ptr<WeightSource> OpenGgufWeights(std::shared_ptr<const GgufFile> file,
                                              const ModelConfig& config);

}  // namespace snapserve::model
