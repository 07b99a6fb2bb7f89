// ModelConfig: the hyper-parameters of a Llama/Mistral decoder, read from a
// Hugging Face config.json (here) or from GGUF metadata (gguf_weights.h).
// Plain data; it knows nothing of tensors or files beyond config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::model {

// How RoPE's inverse frequencies are adjusted (transformers' rope_type).
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3, kFreqFactors };
  Kind kind = Kind::kNone;
  double factor = 1.0;                           // linear and llama3
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 0;  // llama3
  // kFreqFactors: llama.cpp's `rope_freqs.weight` (GGUF files of Llama 3.1+
  // carry the llama3 adjustment precomputed as one divisor per frequency).
  std::vector<float> freq_factors;
};

struct ModelConfig {
  std::string architecture;  // "llama" or "mistral"
  int64_t num_layers = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // explicit head_dim, or hidden / num_heads
  int64_t vocab = 0;
  int64_t max_context = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t sliding_window = 0;  // 0: none (full causal attention)
  int64_t bos_token_id = -1;   // -1: none
  std::vector<int64_t> eos_token_ids;

  // Checks the invariants the forward pass relies on (positive sizes, heads
  // divisible by KV heads, even head_dim, ...). `source` names the file.
  Status Validate(const std::string& source) const;
  std::string DebugString() const;
};

// Parses the text of a Hugging Face config.json. Accepts both the legacy
// `rope_theta` + `rope_scaling` keys and transformers 5's `rope_parameters`.
// `source` names the file in error messages.
StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source);

// Reads and parses <dir>/config.json.
StatusOr<ModelConfig> LoadHfConfig(const std::string& dir);

}  // namespace snapserve::model
