#include "engine/model/llama_model.h"

#include <algorithm>
#include <cmath>

#include "engine/model/linear_method.h"
#include "engine/model/rope.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_team.h"
#include "kernels/fused/fused_cuda.h"
#include "kernels/prefill_attention/prefill_attention.h"
#include "kernels/prefill_gemm/prefill_gemm_amx.h"
#include "kernels/prefill_gemm/prefill_gemm_int8.h"
#include "kernels/quant/quant_matrix.h"
#include "kernels/rowwise/rowwise.h"

namespace snapserve::model {

namespace {
// Prompt rows per MLP slice during prefill (see ContinuePrefill).
constexpr int64_t kPrefillMlpRows = 1024;
}  // namespace

LlamaModel::LlamaModel(ModelConfig config, LlamaWeights weights, at::ScalarType dtype,
                       at::Device device, const LinearPrecision& precision)
    : config_(std::move(config)),
      w_(std::move(weights)),
      dtype_(dtype),
      // Weight-only bfloat16 on CPU (see the header).
      compute_dtype_(device.is_cpu() && dtype == at::kBFloat16 ? at::kFloat : dtype),
      device_(device),
      precision_(precision) {
  inv_freq_ = RopeInvFreq(config_, device_);
  // Norm weights are tiny: keep them in the compute dtype, unrounded.
  for (LayerWeights& l : w_.layers) {
    l.attn_norm = l.attn_norm.to(compute_dtype_);
    l.mlp_norm = l.mlp_norm.to(compute_dtype_);
  }
  w_.final_norm = w_.final_norm.to(compute_dtype_);
  PrepareLinearMethods(w_, precision_, device_);
  step_on_own_kernels_ = StepOnOwnKernels();
}

int64_t LlamaModel::repacked_bytes() const {
  int64_t bytes = w_.lm_head.method.repacked_bytes;
  for (const LayerWeights& l : w_.layers) {
    for (const LinearWeight* w : {&l.qkv, &l.o_proj, &l.gate_up, &l.down}) {
      bytes += w->method.repacked_bytes;
    }
  }
  return bytes;
}

int64_t LlamaModel::bf16_dot_matrices() const {
  if (!device_.is_cpu()) return 0;
  auto counts = [](const LinearWeight& w) {
    return w.dense.defined() && w.dense.scalar_type() == at::kBFloat16 ? 1 : 0;
  };
  int64_t n = counts(w_.lm_head);
  for (const LayerWeights& l : w_.layers) {
    for (const LinearWeight* w : {&l.qkv, &l.o_proj, &l.gate_up, &l.down}) n += counts(*w);
  }
  return n;
}

bool LlamaModel::FusedCuda(const at::Tensor& x) {
  return x.is_cuda() && kernels::cuda_fused_enabled();
}

at::Tensor LlamaModel::RmsNorm(const at::Tensor& x, const at::Tensor& weight,
                               const LinearWeight* consumer) const {
  // As transformers' LlamaRMSNorm: statistics in float32, scale in the compute
  // dtype. x is the float32 residual stream; the result feeds a matmul.
  if (FusedRowwise(x)) {
    const bool bf16 = consumer != nullptr && consumer->method.takes_bfloat16(x.size(0));
    return kernels::rms_norm(x, weight, config_.rms_norm_eps, bf16 ? at::kBFloat16 : at::kFloat);
  }
  // CUDA: one kernel, the same formula and roundings (kernels/fused/fused_cuda.h).
  if (FusedCuda(x) && x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1 &&
      weight.scalar_type() == compute_dtype_) {
    at::Tensor rows = x;  // read only: no delta to add
    at::Tensor out = at::empty(x.sizes(), weight.options());
    kernels::rms_norm_add_cuda_(rows, at::Tensor(), weight, config_.rms_norm_eps, out);
    return out;
  }
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + config_.rms_norm_eps)).to(compute_dtype_);
}

void LlamaModel::AddMlp(at::Tensor& h, const LayerWeights& l, const at::Tensor& x) const {
  // The fused SwiGLU reads a bfloat16 GEMM product as it is: [m, 2 *
  // intermediate], the layer's largest output (kernels/rowwise/rowwise.h).
  // When the down product runs on AMX tiles, which round their input to
  // bfloat16, the gate writes it rounded so (kernels/rowwise/rowwise.h): the same
  // bits, half the bytes, and no conversion pass. (x itself may be bfloat16
  // for the same reason: RmsNorm.)
  if (FusedRowwise(h)) {
    // On AMX tiles both products and the gate run as one pass
    // (kernels/prefill_gemm/prefill_gemm_amx.h, mlp_amx_add_): the same bits.
    if (MlpInOnePass(h, l)) {
      return kernels::mlp_amx_add_(h, x.contiguous(), l.gate_up.method.amx_tiles,
                                   l.down.method.amx_tiles);
    }
    const bool bf16 = l.down.method.takes_bfloat16(x.size(0));
    return AddLinear(h, l.down,
                     kernels::silu_mul(ApplyLinearWidenedLater(l.gate_up, x),
                                       bf16 ? at::kBFloat16 : at::kFloat));
  }
  at::Tensor gate_up = ApplyLinear(l.gate_up, x);  // [m, 2 * intermediate]
  const int64_t inter = config_.intermediate;
  if (FusedCuda(gate_up) && gate_up.dim() == 2 && gate_up.stride(1) == 1) {
    at::Tensor act = at::empty({gate_up.size(0), inter}, gate_up.options());
    kernels::silu_mul_cuda_out(gate_up, act);
    AddLinear(h, l.down, act);
    return;
  }
  at::Tensor act = at::silu(gate_up.narrow(-1, 0, inter)) * gate_up.narrow(-1, inter, inter);
  AddLinear(h, l.down, act);
}

bool LlamaModel::MlpInOnePass(const at::Tensor& h, const LayerWeights& l) const {
  return FusedRowwise(h) && l.gate_up.method.takes_bfloat16(h.size(0)) &&
         l.down.method.takes_bfloat16(h.size(0)) &&
         kernels::amx_mlp_fits(config_.intermediate, config_.hidden) && h.is_contiguous();
}

const kernels::Int8Panels* LlamaModel::SinglePanels(const at::Tensor& x,
                                                    const LinearWeight& w) const {
  return FusedRowwise(x) ? w.method.single_panels(x.size(0)) : nullptr;
}

at::Tensor LlamaModel::NormedLinear(const at::Tensor& h, const at::Tensor& norm,
                                    const LinearWeight& w) const {
  if (FusedRowwise(h) && w.method.takes_bfloat16(h.size(0)) && h.is_contiguous()) {
    return kernels::linear_amx(h, w.method.amx_tiles, kernels::AmxOut::kFloat32,
                               {&norm, config_.rms_norm_eps});
  }
  if (const kernels::Int8Panels* panels = SinglePanels(h, w)) {
    return kernels::linear_int8_panels(h, *panels, kernels::cpu_isa(),
                                       kernels::Int8Input::rms_norm(norm, config_.rms_norm_eps));
  }
  return ApplyLinear(w, RmsNorm(h, norm, &w));
}

void LlamaModel::AddNormedMlp(at::Tensor& h, const LayerWeights& l,
                              at::Tensor* gate_up_buffer) const {
  if (MlpInOnePass(h, l)) {
    kernels::mlp_amx_add_(h, h, l.gate_up.method.amx_tiles, l.down.method.amx_tiles,
                          {&l.mlp_norm, config_.rms_norm_eps});
    return;
  }
  // On int8 panels: the norm inside gate_up's quantization and the gate
  // inside down's; h changes only as down's sums are added.
  const kernels::Int8Panels* gate_up = SinglePanels(h, l.gate_up);
  const kernels::Int8Panels* down = SinglePanels(h, l.down);
  if (gate_up != nullptr && down != nullptr && h.is_contiguous()) {
    const kernels::Int8Input norm = kernels::Int8Input::rms_norm(l.mlp_norm, config_.rms_norm_eps);
    at::Tensor product;
    if (gate_up_buffer != nullptr) {
      if (!gate_up_buffer->defined()) {
        *gate_up_buffer = at::empty({h.size(0), gate_up->n}, h.options());
      }
      kernels::linear_int8_panels_out(*gate_up_buffer, h, *gate_up, kernels::cpu_isa(), norm);
      product = *gate_up_buffer;
    } else {
      product = kernels::linear_int8_panels(h, *gate_up, kernels::cpu_isa(), norm);
    }
    kernels::linear_int8_panels_add_(h, product, *down, kernels::cpu_isa(),
                                     kernels::Int8Input::silu_mul());
    return;
  }
  AddMlp(h, l, RmsNorm(h, l.mlp_norm, &l.gate_up));
}

at::Tensor LlamaModel::Rope(at::Tensor qk, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions) const {
  if (FusedRowwise(qk)) {
    kernels::rope_rotate_(qk, cos, sin);
    return qk;
  }
  // CUDA: in place, from the positions and inverse frequencies (the angles
  // are cos/sin's, kernels/fused/fused_rowwise_cuda.h).
  if (FusedCuda(qk) && qk.stride(2) == 1) {
    kernels::rope_qk_cuda_(qk, positions, inv_freq_);
    return qk;
  }
  return ApplyRope(qk, cos.unsqueeze(1), sin.unsqueeze(1));  // broadcast over heads
}

at::Tensor LlamaModel::Embed(const std::vector<int32_t>& tokens) const {
  for (int32_t t : tokens) {
    TORCH_CHECK(t >= 0 && t < config_.vocab, "token id ", t, " out of range [0, ", config_.vocab,
                ")");
  }
  at::Tensor ids = at::tensor(at::ArrayRef<int32_t>(tokens), at::kInt).to(at::kLong);
  if (w_.embed.quantized()) {
    // The embedding is one matrix of one type in every supported file.
    TORCH_CHECK(w_.embed.parts.size() == 1, "Embed: a quantized embedding has one block type");
    return kernels::dequantize_rows(w_.embed.parts[0], ids);  // float32
  }
  return at::embedding(w_.embed.dense, ids.to(device_));
}

at::Tensor LlamaModel::Logits(const at::Tensor& hidden) const {
  return NormedLinear(hidden, w_.final_norm, w_.lm_head).to(at::kFloat);
}

PromptState LlamaModel::BeginPrompt(int64_t seq, const std::vector<int32_t>& tokens,
                                    int64_t query_rows) const {
  TORCH_CHECK(!tokens.empty(), "Prefill: empty prompt");
  TORCH_CHECK(query_rows >= 0, "Prefill: query_rows must be >= 0");
  PromptState st;
  st.seq = seq;
  st.tokens = tokens;
  st.query_rows = query_rows;
  return st;
}

bool LlamaModel::InSlidingWindow(int64_t start, int64_t rows) const {
  return config_.sliding_window > 0 && start + rows > config_.sliding_window;
}

bool LlamaModel::LowPrecisionAttention(const at::Tensor& q, int64_t start) const {
  return precision_.float_prefill() == kernels::PrefillGemm::kBFloat16 && device_.is_cpu() &&
         !InSlidingWindow(start, q.size(1)) && q.scalar_type() == at::kFloat;
}

void LlamaModel::AddAttention(at::Tensor& h, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, int64_t start,
                              const LinearWeight& o_proj) const {
  const int64_t rows = q.size(1), D = config_.head_dim;
  // On AMX tiles the attention writes o_proj's input as the GEMM's bfloat16
  // tiles (kernels/prefill_attention/prefill_attention.h, prefill_attention_amx_packed): the
  // same bits as its float32 output packed by the GEMM, without that pass.
  if (LowPrecisionAttention(q, start) && kernels::has_prefill_attention_amx(D) &&
      o_proj.method.takes_bfloat16(rows) && h.is_contiguous() && h.scalar_type() == at::kFloat) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    kernels::linear_amx_add_(h, kernels::prefill_attention_amx_packed(q, k, v, scale),
                             o_proj.method.amx_tiles);
    return;
  }
  const at::Tensor attn = ChunkAttention(q, k, v, start);  // [H, rows, D]
  AddLinear(h, o_proj, attn.transpose(0, 1).reshape({rows, config_.num_heads * D}));
}

at::Tensor LlamaModel::ChunkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t start) const {
  const int64_t H = config_.num_heads, Hkv = config_.num_kv_heads, D = config_.head_dim;
  const int64_t rows = q.size(1), keys = k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // Repeat K/V per query head: SDPA's fused CPU/CUDA kernels take equal head
  // counts; the copies live only for this call.
  auto repeat = [&](const at::Tensor& t) {
    return t.unsqueeze(1).expand({Hkv, H / Hkv, keys, D}).reshape({H, keys, D});
  };
  const bool window = InSlidingWindow(start, rows);
  // The lower prompt precisions (bfloat16, int8) cover attention's
  // products too (kernels/prefill_attention/prefill_attention.h): bfloat16 products on AMX
  // tiles, or by vdpbf16ps where the CPU multiplies those faster than
  // float32 (kernels/cpu/cpu_isa.h, bf16_dot_outpaces_fma), else our float32
  // kernel. LibTorch's float32 flash attention stays for float32 prompts
  // (the exact path), other devices and Mistral's window.
  if (LowPrecisionAttention(q, start)) {
    if (kernels::has_prefill_attention_amx(D)) {
      return kernels::prefill_attention_amx(q, k, v, scale);
    }
    if (kernels::has_prefill_attention_bf16(D) && kernels::bf16_dot_outpaces_fma()) {
      return kernels::prefill_attention_bf16(q, k, v, scale);
    }
    if (kernels::has_prefill_attention_f32(D)) {
      return kernels::prefill_attention_f32(q, k, v, scale);
    }
  }
  if (start == 0 && !window) {
    return at::scaled_dot_product_attention(q, repeat(k), repeat(v), std::nullopt, 0.0,
                                            /*is_causal=*/true, scale);
  }
  // Query row r sits at position start + r and sees keys at positions
  // <= start + r; Mistral's window also hides keys at or before
  // start + r - sliding_window (transformers' sliding_window_overlay).
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device_);
  at::Tensor qi = at::arange(start, start + rows, opts).unsqueeze(1);
  at::Tensor ki = at::arange(keys, opts).unsqueeze(0);
  at::Tensor mask = ki <= qi;
  if (config_.sliding_window > 0) mask = mask & (ki > qi - config_.sliding_window);
  return at::scaled_dot_product_attention(q, repeat(k), repeat(v), mask, 0.0,
                                          /*is_causal=*/false, scale);
}

at::Tensor LlamaModel::ContinuePrompt(PromptState& st, KvStore& store, int64_t max_tokens) const {
  TORCH_CHECK(max_tokens >= 1, "ContinuePrompt: max_tokens must be >= 1");
  TORCH_CHECK(!st.finished(), "ContinuePrompt: the prompt has already run");
  const int64_t n = st.n(), start = st.done;
  const int64_t rows = std::min(max_tokens, n - start), end = start + rows;
  const bool whole = start == 0 && end == n;  // nothing kept between chunks
  const int64_t H = config_.num_heads, Hkv = config_.num_kv_heads, D = config_.head_dim;
  const auto tensor_opts = at::TensorOptions().dtype(compute_dtype_).device(device_);
  if (!whole && st.keys.empty()) {
    st.keys.resize(config_.num_layers);
    st.values.resize(config_.num_layers);
    st.queries.resize(config_.num_layers);
    for (int64_t i = 0; i < config_.num_layers; ++i) {
      st.keys[i] = at::empty({Hkv, n, D}, tensor_opts);
      st.values[i] = at::empty({Hkv, n, D}, tensor_opts);
    }
  }
  at::Tensor positions =
      at::arange(start, end, at::TensorOptions().dtype(at::kLong).device(device_));
  const auto [cos, sin] = RopeCosSin(inv_freq_, positions, compute_dtype_);  // [rows, D]
  const std::vector<int32_t> chunk(st.tokens.begin() + start, st.tokens.begin() + end);
  at::Tensor h = Embed(chunk).to(at::kFloat);  // [rows, hidden], the float32 residual stream
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const LayerWeights& l = w_.layers[i];
    at::Tensor qkv = NormedLinear(h, l.attn_norm, l.qkv).view({rows, H + 2 * Hkv, D});
    // q and k are adjacent heads of one buffer: one RoPE call rotates both.
    at::Tensor qk = Rope(qkv.narrow(1, 0, H + Hkv), cos, sin, positions);
    at::Tensor q = qk.narrow(1, 0, H).transpose(0, 1);           // [H, rows, D]
    at::Tensor k = qk.narrow(1, H, Hkv).transpose(0, 1);         // [Hkv, rows, D]
    at::Tensor v = qkv.narrow(1, H + Hkv, Hkv).transpose(0, 1);  // [Hkv, rows, D]
    // The keys and values this chunk's queries see.
    at::Tensor keys = k, values = v;
    if (whole) {
      store.StorePrefillLayer(st.seq, i, q, k, v);
    } else {
      st.keys[i].narrow(1, start, rows).copy_(k);
      st.values[i].narrow(1, start, rows).copy_(v);
      keys = st.keys[i].narrow(1, 0, end);
      values = st.values[i].narrow(1, 0, end);
      if (st.query_rows > 0) {
        at::Tensor recent = st.queries[i].defined() ? at::cat({st.queries[i], q}, 1) : q;
        const int64_t kept = std::min(st.query_rows, recent.size(1));
        st.queries[i] = recent.narrow(1, recent.size(1) - kept, kept).contiguous();
      }
      if (end == n) {
        store.StorePrefillLayer(st.seq, i, st.query_rows > 0 ? st.queries[i] : q, keys, values);
        st.keys[i] = at::Tensor();
        st.values[i] = at::Tensor();
        st.queries[i] = at::Tensor();
      }
    }
    // In place, as Decode does: the int8 panels add their sums straight into
    // h (no [rows, hidden] temporary and no separate add pass; the same bits
    // as h + Linear). h is this function's own tensor from Embed on.
    AddAttention(h, q, keys, values, start, l.o_proj);
    // The MLP is row-wise: over long chunks it runs on slices of rows so its
    // [rows, 2 * intermediate] buffers stay small (96 MiB each at 8K tokens
    // otherwise, several alive at once), in place on the residual.
    for (int64_t r = 0; r < rows; r += kPrefillMlpRows) {
      at::Tensor slice = h.narrow(0, r, std::min(kPrefillMlpRows, rows - r));
      AddNormedMlp(slice, l);
    }
  }
  st.done = end;
  if (st.finished()) {
    st.keys.clear();
    st.values.clear();
    st.queries.clear();
  }
  return h;
}

at::Tensor LlamaModel::Prefill(int64_t seq, const std::vector<int32_t>& tokens, KvStore& store,
                               bool all_logits) {
  PromptState st = BeginPrompt(seq, tokens, /*query_rows=*/0);
  const at::Tensor h = ContinuePrompt(st, store, st.n());
  return all_logits ? Logits(h) : Logits(h.narrow(0, st.n() - 1, 1)).squeeze(0);
}

at::Tensor LlamaModel::Decode(const std::vector<int64_t>& seqs, const std::vector<int32_t>& tokens,
                              const std::vector<int64_t>& positions, KvStore& store) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  TORCH_CHECK(B > 0 && tokens.size() == seqs.size() && positions.size() == seqs.size(),
              "Decode: seqs, tokens and positions must have the same non-zero size");
  const int64_t H = config_.num_heads, D = config_.head_dim;

  at::Tensor pos = at::tensor(at::ArrayRef<int64_t>(positions), at::kLong).to(device_);
  // [B, D] each. Named references, not a structured binding: Debian 12's
  // clang (clang-tidy's) cannot capture a binding in the step's lambda.
  const std::pair<at::Tensor, at::Tensor> rope = RopeCosSin(inv_freq_, pos, compute_dtype_);
  const at::Tensor& cos = rope.first;
  const at::Tensor& sin = rope.second;

  at::Tensor logits;
  const auto step = [&] {
    at::Tensor h = Embed(tokens).to(at::kFloat);  // [B, hidden], float32 residual stream
    store.BeginDecodeStep(seqs);
    // The products on int8 panels write into buffers made once per step,
    // and the q, k and v views of the qkv buffer are made once too: each
    // LibTorch allocation or view costs about a microsecond on the leading
    // thread while the team's other threads wait, and a batch-1 step had
    // ~10 per layer (docs/quantized-weights.md, "A decode step's buffers").
    DecodeBuffers buffers;
    for (int64_t i = 0; i < config_.num_layers; ++i) {
      const LayerWeights& l = w_.layers[i];
      const QkvHeads heads = DecodeQkv(h, l, buffers, cos, sin, pos);
      at::Tensor attn = store.DecodeAttention(seqs, i, heads.q, heads.k, heads.v);  // [B, H, D]
      AddLinear(h, l.o_proj, attn.reshape({B, H * D}));
      AddNormedMlp(h, l, &buffers.gate_up);
    }
    store.EndDecodeStep();
    logits = Logits(h);
  };
  // ~150 short parallel loops: on one team of threads where every one of
  // them is a snapserve kernel (kernels/cpu/parallel_team.h).
  if (step_on_own_kernels_) {
    kernels::run_as_team(step);
  } else {
    step();
  }
  return logits;
}

LlamaModel::QkvHeads LlamaModel::DecodeQkv(const at::Tensor& h, const LayerWeights& l,
                                           DecodeBuffers& buffers, const at::Tensor& cos,
                                           const at::Tensor& sin,
                                           const at::Tensor& positions) const {
  const int64_t B = h.size(0), H = config_.num_heads, Hkv = config_.num_kv_heads;
  const int64_t D = config_.head_dim;
  const auto split = [&](const at::Tensor& qkv, const at::Tensor& qk) {
    return QkvHeads{qk.narrow(1, 0, H), qk.narrow(1, H, Hkv), qkv.narrow(1, H + Hkv, Hkv)};
  };
  if (const kernels::Int8Panels* panels = SinglePanels(h, l.qkv)) {
    if (!buffers.qkv.defined()) {
      buffers.qkv = at::empty({B, panels->n}, h.options());
      const at::Tensor qkv = buffers.qkv.view({B, H + 2 * Hkv, D});
      buffers.qk = qkv.narrow(1, 0, H + Hkv);
      buffers.heads = split(qkv, buffers.qk);
    }
    kernels::linear_int8_panels_out(
        buffers.qkv, h, *panels, kernels::cpu_isa(),
        kernels::Int8Input::rms_norm(l.attn_norm, config_.rms_norm_eps));
    // Panels mean CPU float32 rows (SinglePanels), which RoPE rotates in
    // place: the views stay the heads.
    const at::Tensor qk = Rope(buffers.qk, cos, sin, positions);
    TORCH_INTERNAL_ASSERT(qk.is_same(buffers.qk), "DecodeQkv: RoPE did not rotate in place");
    return buffers.heads;
  }
  const at::Tensor qkv = NormedLinear(h, l.attn_norm, l.qkv).view({B, H + 2 * Hkv, D});
  return split(qkv, Rope(qkv.narrow(1, 0, H + Hkv), cos, sin, positions));
}

bool LlamaModel::StepOnOwnKernels() const {
  if (!device_.is_cpu() || compute_dtype_ != at::kFloat || !w_.lm_head.quantized()) return false;
  return std::all_of(w_.layers.begin(), w_.layers.end(), [](const LayerWeights& l) {
    return l.qkv.quantized() && l.o_proj.quantized() && l.gate_up.quantized() && l.down.quantized();
  });
}

}  // namespace snapserve::model
