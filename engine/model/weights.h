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
#include "engine/model/linear_method.h"
#include "engine/model/model_config.h"
#include "kernels/quant/quant_matrix.h"

namespace snapserve::model {

// Receives loader progress lines; the engine has no logging library.
using LogFn = std::function<void(const std::string&)>;
// Writes "[snapserve.model] <line>" to stderr.
void LogToStderr(const std::string& line);

// A matrix [rows, cols] of a linear layer (or the embedding): a dense tensor,
// or, on CPU, GGUF blocks kept as the file stores them (kernels/quant/quant_matrix.h).
// Fused matrices (q/k/v, gate/up) whose parts have different block types,
// as in llama.cpp's Q4_K_M mixes, keep one QuantMatrix per run of rows of one
// type; the linear computes each and places its columns.
struct LinearWeight {
  at::Tensor dense;                         // defined when not quantized
  std::vector<kernels::QuantMatrix> parts;  // else: row groups, in order
  // The kernels that multiply it and their repacked data, chosen once the
  // model is loaded (linear_method.h, PrepareLinearMethod).
  LinearMethod method;

  bool quantized() const { return !dense.defined(); }
  int64_t rows() const;
  int64_t cols() const;
  // Bytes of weights held (what one use streams from memory).
  int64_t nbytes() const;
  // "Q4_1", "Q4_K+Q6_K", or the dense dtype's name.
  std::string format() const;
};

// Rows of `parts` stacked in order (all dense, or all quantized: runs of one
// block type are merged into one QuantMatrix). A mix of dense and quantized
// parts is made dense in `dtype`.
LinearWeight StackRows(std::vector<LinearWeight> parts, at::ScalarType dtype);

struct LayerWeights {
  at::Tensor attn_norm;  // [hidden]
  LinearWeight qkv;      // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]; q, k, v rows
  LinearWeight o_proj;   // [hidden, num_heads * head_dim]
  at::Tensor mlp_norm;   // [hidden]
  LinearWeight gate_up;  // [2 * intermediate, hidden]; gate rows, then up rows
  LinearWeight down;     // [hidden, intermediate]
};

struct LlamaWeights {
  LinearWeight embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [hidden]
  LinearWeight lm_head;   // [vocab, hidden]; shares `embed`'s memory when tied
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
  // A matrix for a linear layer or the embedding. A source whose format has
  // quantized blocks may keep them (GGUF on CPU); the default loads it dense.
  virtual StatusOr<LinearWeight> LoadLinear(const std::string& hf_name, at::ScalarType dtype,
                                            at::Device device);
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
