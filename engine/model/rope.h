// Rotary position embeddings, computed the way transformers computes them
// (modeling_rope_utils.py + LlamaRotaryEmbedding): float32 inverse
// frequencies, cos/sin of absolute positions in float32 cast to the run dtype,
// and the "rotate half" layout (pairs are (i, i + head_dim/2)). GGUF weights
// are un-permuted to this layout at load time (gguf_weights.cc).
#pragma once

#include <utility>

#include <ATen/ATen.h>

#include "engine/model/model_config.h"

namespace snapserve::model {

// [head_dim / 2] float32 on `device`, with the config's scaling applied.
at::Tensor RopeInvFreq(const ModelConfig& config, at::Device device);

// cos and sin [n, head_dim] in `dtype` for absolute `positions` (int64 [n]).
std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq,
                                             const at::Tensor& positions, at::ScalarType dtype);

// x * cos + rotate_half(x) * sin; x [..., head_dim], cos/sin broadcastable to x.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace snapserve::model
