// LlamaModel: the decoder forward pass of LlamaForCausalLM and
// MistralForCausalLM in ATen ops (GQA, RoPE at absolute positions, RMSNorm,
// SwiGLU, tied or untied embeddings, Mistral's sliding window). It owns the
// weights and nothing else: K/V live in a KvStore the caller passes in
// (kv_store.h), so the same forward serves the dense test cache, the paged
// cache and SnapKV. It never samples; it returns logits.
//
// Numerics follow transformers op for op (RMSNorm in float32, RoPE cos/sin in
// float32 cast to the compute dtype, softmax in float32), so float32 logits
// agree with transformers to ~1e-5. Two deliberate differences for low
// precision:
// - the residual stream stays float32 (two casts per layer on CUDA), which
//   removes the rounding of 30 layers' sums;
// - on CPU a bfloat16 model is weight-only bfloat16: the matrices are stored
//   in bfloat16 (half the memory and bandwidth of float32) and multiplied
//   into float32 activations by kernels/linear.h; norms, attention,
//   SnapKV scoring and logits run in float32, and the KV cache keeps the
//   model dtype. CPUs without bfloat16 arithmetic gain nothing from bfloat16
//   activations, while their rounding costs accuracy. Measured on SmolLM2
//   Q4_1, 2048 tokens of GPL-3, teacher-forced top-1 agreement with
//   transformers' float32: transformers bfloat16 97.2%, full bfloat16 compute
//   97.0%, weight-only bfloat16 (this) in tests/python/test_model_parity.py.
//   On CUDA, bfloat16 and float16 models compute in their dtype.
//
// Preconditions (the caller validates requests; violations throw c10::Error,
// a programming error, not a request error): token ids in [0, vocab), tokens
// non-empty, positions >= 0 and < max_context, sizes of the vectors agree.
// Not thread-safe: one caller at a time (the scheduler thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "engine/common/status_or.h"
#include "engine/model/kv_store.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "kernels/linear.h"

namespace snapserve::model {

// A prompt's prefill in progress (LlamaModel::BeginPrefill): the residual
// stream after `next_layer` layers and what every layer reuses. Lets the
// scheduler run a long prompt a few layers at a time, with decode steps of
// other sequences in between, without changing a single number: the layers
// run in the same order on the same tensors as in one Prefill call.
struct PrefillState {
  int64_t seq = 0;
  int64_t n = 0;                   // prompt length
  int64_t next_layer = 0;          // layers [0, next_layer) are done and stored
  at::Tensor h;                    // [n, hidden] float32 residual stream
  at::Tensor cos, sin;             // [n, 1, head_dim] RoPE tables in the compute dtype
  std::optional<at::Tensor> mask;  // Mistral sliding window; else causal
};

class LlamaModel {
 public:
  LlamaModel(ModelConfig config, LlamaWeights weights, at::ScalarType dtype, at::Device device);

  // How decode-sized batches multiply GGUF blocks (kernels/linear.h): exact
  // decoding (the default) or int8 block dot products.
  void set_quant_dot(kernels::QuantDot dot) { quant_dot_ = dot; }
  kernels::QuantDot quant_dot() const { return quant_dot_; }

  const ModelConfig& config() const { return config_; }
  // Storage dtype of the weights (and of a KV cache made for this model).
  at::ScalarType dtype() const { return dtype_; }
  // Dtype of activations and of the q/k/v handed to a KvStore: float32 for a
  // bfloat16 model on CPU, else dtype().
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  at::Device device() const { return device_; }

  // Runs one sequence's prompt (positions 0..n-1) layer by layer; after each
  // layer's attention, hands its post-RoPE q/k/v to `store` and drops them.
  // Returns float32 logits of the last position [vocab], or of every
  // position [n, vocab] when `all_logits`.
  at::Tensor Prefill(int64_t seq, const std::vector<int32_t>& tokens, KvStore& store,
                     bool all_logits = false);

  // The same prefill in slices: BeginPrefill embeds the prompt, each
  // ContinuePrefill runs up to `max_layers` more layers (>= 1) through
  // `store`, and PrefillLogits reads the result once every layer has run.
  // Memory between slices: the state's [n, hidden] residual stream; a
  // layer's full K/V lives only inside the ContinuePrefill that computes it.
  PrefillState BeginPrefill(int64_t seq, const std::vector<int32_t>& tokens) const;
  // Returns true when the last layer has run.
  bool ContinuePrefill(PrefillState& state, KvStore& store, int64_t max_layers) const;
  at::Tensor PrefillLogits(const PrefillState& state, bool all_logits = false) const;

  // One batched decode step: sequence seqs[b] feeds tokens[b] at absolute
  // position positions[b] (RoPE uses the position, not the cache length,
  // which SnapKV makes shorter). Projections and MLP run as one matmul over
  // the batch; attention goes through `store`. Returns float32 logits [B, vocab].
  at::Tensor Decode(const std::vector<int64_t>& seqs, const std::vector<int32_t>& tokens,
                    const std::vector<int64_t>& positions, KvStore& store);

 private:
  // x [m, in] in the compute dtype, w [out, in] -> [m, out].
  at::Tensor Linear(const at::Tensor& x, const LinearWeight& w) const;
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor Mlp(const LayerWeights& l, const at::Tensor& x) const;
  at::Tensor Embed(const std::vector<int32_t>& tokens) const;
  at::Tensor Logits(const at::Tensor& hidden) const;  // [m, hidden] -> float32 [m, vocab]

  ModelConfig config_;
  LlamaWeights w_;
  at::ScalarType dtype_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  at::Tensor inv_freq_;  // [head_dim / 2] float32
  kernels::QuantDot quant_dot_ = kernels::QuantDot::kExact;
};

// Loads a model: a .gguf file, a Hugging Face directory (config.json +
// safetensors) or a synthetic spec (synthetic_weights.h). `log` receives
// progress lines (default: stderr). `quant_dot` applies to GGUF blocks kept
// quantized on CPU.
StatusOr<std::unique_ptr<LlamaModel>> LoadModel(
    const std::string& path, at::ScalarType dtype, at::Device device,
    const LogFn& log = LogToStderr, kernels::QuantDot quant_dot = kernels::QuantDot::kExact);

}  // namespace snapserve::model
