// Model weights in the layout the forward pass wants, and the loaders that
// build them. Tensors are named the Hugging Face way
// ("model.layers.3.self_attn.q_proj.weight"); each file format provides them
// through a WeightSource (HF safetensors directory here, GGUF in
// gguf_weights.h), and AssembleWeights checks every shape against the config
// and fuses projections: q/k/v into one matrix and gate/up into one, so a
// decode step runs one matmul for each instead of three and two.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "engine/common/status_or.h"
#include "engine/model/model_config.h"

namespace snapserve::model {

// Receives loader progress lines; the engine has no logging library.
using LogFn = std::function<void(const std::string&)>;
// Writes "[snapserve.model] <line>" to stderr.
void LogToStderr(const std::string& line);

struct LayerWeights {
  at::Tensor attn_norm;  // [hidden]
  at::Tensor qkv;        // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]; q, k, v rows
  at::Tensor o_proj;     // [hidden, num_heads * head_dim]
  at::Tensor mlp_norm;   // [hidden]
  at::Tensor gate_up;    // [2 * intermediate, hidden]; gate rows, then up rows
  at::Tensor down;       // [hidden, intermediate]
};

struct LlamaWeights {
  at::Tensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [hidden]
  at::Tensor lm_head;     // [vocab, hidden]; the same tensor as `embed` when tied
};

// Provides HF-named tensors from some file format.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Has(const std::string& hf_name) const = 0;
  // The tensor in `dtype` on `device`, owning its memory (never a view of a
  // mapped file). NotFound if absent; errors name the file and the tensor.
  virtual StatusOr<at::Tensor> Load(const std::string& hf_name, at::ScalarType dtype,
                                    at::Device device) = 0;
  // The file that holds `hf_name` (or the source's path), for error messages.
  virtual std::string Where(const std::string& hf_name) const = 0;
};

// Loads and checks every tensor the config calls for. Logs progress (tensors
// done / total), time and resident memory through `log` (may be empty).
StatusOr<LlamaWeights> AssembleWeights(const ModelConfig& config, WeightSource& source,
                                       at::ScalarType dtype, at::Device device, const LogFn& log);

// A Hugging Face model directory: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json`.
StatusOr<std::unique_ptr<WeightSource>> OpenHfWeights(const std::string& dir);

// Resident set size of this process in bytes (0 if unknown).
int64_t ResidentBytes();

}  // namespace snapserve::model
