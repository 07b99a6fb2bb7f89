// LlamaModel: the decoder forward pass of LlamaForCausalLM and
// MistralForCausalLM in ATen ops (GQA, RoPE at absolute positions, RMSNorm,
// SwiGLU, tied or untied embeddings, Mistral's sliding window). It owns the
// weights and nothing else: K/V live in a KvStore the caller passes in
// (kv_store.h), so the same forward serves the dense test cache, the paged
// cache and SnapKV. It never samples; it returns logits. Each matrix is
// multiplied by the kernels its LinearMethod chose when the model was built
// (linear_method.h); the forward asks a matrix's method which kernel serves
// it where it fuses a row-wise step into that kernel.
//
// Numerics follow transformers op for op (RMSNorm in float32, RoPE cos/sin in
// float32 cast to the compute dtype, softmax in float32), so float32 logits
// agree with transformers to ~1e-5. Two deliberate differences for low
// precision:
// - the residual stream stays float32 (two casts per layer on CUDA), which
//   removes the rounding of 30 layers' sums;
// - on CPU a bfloat16 model is weight-only bfloat16: the matrices are stored
//   in bfloat16 (half the memory and bandwidth of float32) and multiplied
//   into float32 activations by kernels/linear/linear.h; norms, attention,
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
#include "engine/model/linear_precision.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace snapserve::model {

// A prompt's prefill in progress (LlamaModel::BeginPrompt): which tokens have
// run and, between chunks, what later chunks attend to. A prompt advances by
// chunks of tokens, each through every layer, so the scheduler can mix a few
// hundred prompt tokens with a decode step (docs/kv-cache-and-scheduling.md,
// "Chunked prefill").
//
// A prompt that runs in one chunk holds nothing here: each layer's K/V goes
// to the KvStore right after that layer. A prompt split into chunks keeps its
// post-RoPE K/V of every layer here until its last chunk, because the KvStore
// (SnapKV) needs the whole prompt's K/V and the last `query_rows` queries of
// each layer at once; only then is every layer handed over and these freed.
struct PromptState {
  int64_t seq = 0;
  std::vector<int32_t> tokens;
  int64_t done = 0;        // tokens [0, done) have run through every layer
  int64_t query_rows = 0;  // queries per layer the KvStore needs at the end
  // Per layer, allocated at the first chunk of a prompt that needs several:
  // K/V [num_kv_heads, n, head_dim] (filled up to `done`) and the last
  // min(done, query_rows) queries [num_heads, rows, head_dim].
  std::vector<at::Tensor> keys, values, queries;

  int64_t n() const { return static_cast<int64_t>(tokens.size()); }
  bool finished() const { return done == n(); }
};

class LlamaModel {
 public:
  // Chooses every matrix's kernel for `precision` and makes what those
  // kernels read (int8 panels, bfloat16 copies, AMX tiles), on the calling
  // thread (linear_method.h, PrepareLinearMethods).
  LlamaModel(ModelConfig config, LlamaWeights weights, at::ScalarType dtype, at::Device device,
             const LinearPrecision& precision = {});

  // The precision the model's matrices were prepared for.
  const LinearPrecision& linear_precision() const { return precision_; }
  // Matrices --decode-dot applies to: the layers' and the LM head's that
  // are dense bfloat16 on CPU (GGUF blocks and float32 matrices are not).
  int64_t bf16_dot_matrices() const;
  // Bytes of the matrices' repacked data (0 when none is kept).
  int64_t repacked_bytes() const;

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

  // The same prefill in chunks of tokens: BeginPrompt checks and copies the
  // prompt; each ContinuePrompt runs its next (up to) `max_tokens` tokens
  // through every layer, attending to the chunks before, and returns their
  // final hidden states [rows, hidden] (float32 residual stream; Logits turns
  // them into logits). The chunk that ends the prompt hands every layer's K/V
  // (and the last `query_rows` queries) to `store`, in layer order.
  PromptState BeginPrompt(int64_t seq, const std::vector<int32_t>& tokens,
                          int64_t query_rows) const;
  at::Tensor ContinuePrompt(PromptState& state, KvStore& store, int64_t max_tokens) const;
  // Final norm and LM head: hidden [m, hidden] -> float32 logits [m, vocab].
  at::Tensor Logits(const at::Tensor& hidden) const;

  // One batched decode step: sequence seqs[b] feeds tokens[b] at absolute
  // position positions[b] (RoPE uses the position, not the cache length,
  // which SnapKV makes shorter). Projections and MLP run as one matmul over
  // the batch; attention goes through `store`. Returns float32 logits [B, vocab].
  at::Tensor Decode(const std::vector<int64_t>& seqs, const std::vector<int32_t>& tokens,
                    const std::vector<int64_t>& positions, KvStore& store);

 private:
  // RMSNorm of x feeding `consumer`: rounded to bfloat16 already where
  // `consumer` multiplies x's rows on AMX tiles (LinearMethod::takes_bfloat16), the bits
  // that GEMM would round them to.
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight,
                     const LinearWeight* consumer = nullptr) const;
  // h += the MLP of x.
  void AddMlp(at::Tensor& h, const LayerWeights& l, const at::Tensor& x) const;
  // Whether AddMlp runs both products and the gate as one pass on AMX tiles
  // (kernels::mlp_amx_add_) for h's rows.
  bool MlpInOnePass(const at::Tensor& h, const LayerWeights& l) const;
  // The one set of int8 panels w has for x's rows, where the row-wise step
  // before it can run inside its quantization (FusedRowwise rows); else
  // nullptr (LinearMethod::single_panels).
  const kernels::Int8Panels* SinglePanels(const at::Tensor& x, const LinearWeight& w) const;
  // ApplyLinear(w, RmsNorm(h, norm, &w)), and AddMlp(h, l, RmsNorm(h, l.mlp_norm,
  // &l.gate_up)): on AMX tiles the norm runs as the GEMM packs h's rows
  // (kernels/prefill_gemm/prefill_gemm_amx.h, AmxRowNorm), on int8 panels as the GEMM
  // quantizes them, and the SwiGLU gate too (kernels/prefill_gemm/prefill_gemm_int8.h,
  // Int8Input): the same bits without the norm's and the gate's own passes
  // over the rows.
  at::Tensor NormedLinear(const at::Tensor& h, const at::Tensor& norm, const LinearWeight& w) const;
  // gate_up_buffer: where gate_up's product on int8 panels goes, allocated
  // on first use ([rows, 2 * intermediate]) and reused by later calls with
  // as many rows (a decode step's layers); nullptr: a tensor per call.
  void AddNormedMlp(at::Tensor& h, const LayerWeights& l,
                    at::Tensor* gate_up_buffer = nullptr) const;
  // A decode step's rotated q [B, H, D], k and v [B, Hkv, D] of one layer.
  struct QkvHeads {
    at::Tensor q, k, v;
  };
  // What a decode step's layers reuse (Decode): the qkv and gate_up
  // products on int8 panels, and the views of the qkv buffer.
  struct DecodeBuffers {
    at::Tensor qkv;  // [B, (H + 2 Hkv) D]
    at::Tensor qk;   // [B, H + Hkv, D], a view of qkv
    QkvHeads heads;  // views of qkv
    at::Tensor gate_up;
  };
  // The layer's qkv product of the residual rows h, RoPE applied: into
  // `buffers` where l.qkv has int8 panels for h's rows, else new tensors.
  QkvHeads DecodeQkv(const at::Tensor& h, const LayerWeights& l, DecodeBuffers& buffers,
                     const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& positions) const;
  // Rotates the q and k heads of a fused qkv output ([rows, H + Hkv, D]);
  // cos/sin [rows, D] of positions [rows] int64. Returns the rotated heads
  // (in place on CPU float32 and where FusedCuda holds).
  at::Tensor Rope(at::Tensor qk, const at::Tensor& cos, const at::Tensor& sin,
                  const at::Tensor& positions) const;
  // Whether every product and row-wise step of a decode step runs in
  // snapserve's CPU kernels (all matrices GGUF blocks, float32 compute on
  // CPU), so the step can run on one team of threads (kernels/cpu/parallel_team.h):
  // LibTorch's own parallel loops would run on one thread there.
  bool StepOnOwnKernels() const;
  // CPU float32 compute: the row-wise steps run as fused kernels (kernels/rowwise/rowwise.h).
  bool FusedRowwise(const at::Tensor& x) const {
    return x.is_cpu() && compute_dtype_ == at::kFloat && x.scalar_type() == at::kFloat;
  }
  // CUDA tensors: RMSNorm, RoPE and the SwiGLU gate run as single kernels
  // (kernels/fused/fused_cuda.h) unless SNAPSERVE_CUDA_FUSED=0.
  static bool FusedCuda(const at::Tensor& x);
  at::Tensor Embed(const std::vector<int32_t>& tokens) const;
  // Whether a chunk of `rows` queries from position `start` on reaches past
  // Mistral's sliding window.
  bool InSlidingWindow(int64_t start, int64_t rows) const;
  // Whether ChunkAttention takes the lower prompt precisions' kernels
  // (kernels/prefill_attention/prefill_attention.h) for queries q from position `start` on.
  bool LowPrecisionAttention(const at::Tensor& q, int64_t start) const;
  // h += o_proj(ChunkAttention(q, k, v, start)) (h the float32 residual rows).
  void AddAttention(at::Tensor& h, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    int64_t start, const LinearWeight& o_proj) const;
  // Attention of one chunk's queries q [H, rows, D] (prompt positions
  // [start, start + rows)) over keys/values [Hkv, start + rows, D]: causal,
  // and Mistral's sliding window when the model has one.
  at::Tensor ChunkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t start) const;

  ModelConfig config_;
  LlamaWeights w_;
  at::ScalarType dtype_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  at::Tensor inv_freq_;  // [head_dim / 2] float32
  LinearPrecision precision_;
  bool step_on_own_kernels_ = false;  // StepOnOwnKernels(), fixed at load
};

// Loads a model: a .gguf file, a Hugging Face directory (config.json +
// safetensors) or a synthetic spec (synthetic_weights.h). `log` receives
// progress lines (default: stderr). Every matrix's kernel is chosen for
// `precision` as the model is built (LlamaModel's constructor).
StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const std::string& path, at::ScalarType dtype,
                                                at::Device device, const LogFn& log = LogToStderr,
                                                const LinearPrecision& precision = {});

}  // namespace snapserve::model
