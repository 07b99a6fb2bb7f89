#include "engine/model/gguf_weights.h"

#include "kernels/quant/quant_blocks.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <regex>

namespace snapserve::model {
namespace {

float HalfAt(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// llama.cpp's converter stores each head's rows as interleaved pairs; this
// puts row (h, i, j) [j in {0,1}, i < head_dim/2] back at (h, j, i), as
// transformers' _reverse_permute_weights does.
at::Tensor UnpermuteRows(const at::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1);
  return w.view({heads, rows / heads / 2, 2, cols}).transpose(1, 2).reshape({rows, cols});
}

class GgufWeightSource : public WeightSource {
 public:
  GgufWeightSource(std::shared_ptr<const GgufFile> file, const ModelConfig& config)
      : file_(std::move(file)), config_(config) {}

  bool Has(const std::string& hf_name) const override {
    auto g = GgufNameForHf(hf_name);
    return g && file_->FindTensor(*g) != nullptr;
  }

  std::string Where(const std::string& /*hf_name*/) const override { return file_->path(); }

  StatusOr<at::Tensor> Load(const std::string& hf_name, at::ScalarType dtype,
                            at::Device device) override {
    auto t = Find(hf_name);
    if (!t.ok()) return t.status();
    const GgufTensorInfo& info = **t;
    auto f = DequantizeGgufTensor(info, file_->path());
    if (!f.ok()) return f.status();
    try {
      auto w = Unpermuted(info, std::move(f).value());
      if (!w.ok()) return w.status();
      return w->to(device, dtype, /*non_blocking=*/false, /*copy=*/false).contiguous();
    } catch (const c10::Error& e) {
      return Status::Internal(file_->path() + ": tensor `" + info.name +
                              "`: conversion failed: " + e.what_without_backtrace());
    }
  }

  // On CPU, a matrix in a supported block format stays in its blocks (copied
  // out of the mapping, rows un-permuted like the dense path): see
  // kernels/quant/quant_matrix.h. Anything else loads dense.
  StatusOr<LinearWeight> LoadLinear(const std::string& hf_name, at::ScalarType dtype,
                                    at::Device device) override {
    auto t = Find(hf_name);
    if (!t.ok()) return t.status();
    const GgufTensorInfo& info = **t;
    const auto type = kernels::quant_type_from_ggml(info.type);
    if (!device.is_cpu() || !type || info.dims.size() != 2) {
      return WeightSource::LoadLinear(hf_name, dtype, device);
    }
    const kernels::QuantFormat& f = kernels::quant_format(*type);
    const int64_t cols = info.dims[0], rows = info.dims[1];
    if (cols <= 0 || rows <= 0 || cols % f.block_elements != 0 ||
        info.nbytes != static_cast<uint64_t>(rows * (cols / f.block_elements) * f.block_bytes)) {
      return Status::InvalidArgument(file_->path() + ": tensor `" + info.name + "` (" + f.name +
                                     "): byte size does not match its shape");
    }
    try {
      const int64_t row_bytes = cols / f.block_elements * f.block_bytes;
      at::Tensor bytes = at::empty({rows, row_bytes}, at::kByte);
      std::memcpy(bytes.data_ptr<uint8_t>(), info.data, info.nbytes);
      auto unpermuted = Unpermuted(info, std::move(bytes));
      if (!unpermuted.ok()) return unpermuted.status();
      LinearWeight w;
      w.parts.push_back(kernels::make_quant_matrix(*type, rows, cols, unpermuted->contiguous(),
                                                   info.name.c_str()));
      return w;
    } catch (const c10::Error& e) {
      return Status::Internal(file_->path() + ": tensor `" + info.name +
                              "`: loading its blocks failed: " + e.what_without_backtrace());
    }
  }

 private:
  StatusOr<const GgufTensorInfo*> Find(const std::string& hf_name) const {
    auto g = GgufNameForHf(hf_name);
    if (!g) return Status::NotFound(file_->path() + ": no GGUF name for tensor `" + hf_name + "`");
    const GgufTensorInfo* t = file_->FindTensor(*g);
    if (t == nullptr) {
      return Status::NotFound(file_->path() + ": tensor `" + *g + "` (for `" + hf_name +
                              "`) not found");
    }
    return t;
  }

  // q and k rows back in transformers' order (UnpermuteRows); `w` has one row
  // per output (float32 values, or a row's bytes of blocks).
  StatusOr<at::Tensor> Unpermuted(const GgufTensorInfo& info, at::Tensor w) const {
    const bool is_q = info.name.find(".attn_q.") != std::string::npos;
    const bool is_k = info.name.find(".attn_k.") != std::string::npos;
    if (!is_q && !is_k) return w;
    const int64_t heads = is_q ? config_.num_heads : config_.num_kv_heads;
    if (w.dim() != 2 || heads <= 0 || w.size(0) % (2 * heads) != 0) {
      return Status::InvalidArgument(file_->path() + ": tensor `" + info.name + "` has " +
                                     std::to_string(w.dim() == 2 ? w.size(0) : -1) +
                                     " rows, not a multiple of 2 x " + std::to_string(heads) +
                                     " heads");
    }
    return UnpermuteRows(w, heads);
  }

 public:
 private:
  std::shared_ptr<const GgufFile> file_;
  ModelConfig config_;
};

}  // namespace

std::optional<std::string> GgufNameForHf(const std::string& hf_name) {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.+)\.weight)");
  std::smatch m;
  if (!std::regex_match(hf_name, m, layer_re)) return std::nullopt;
  static const std::pair<const char*, const char*> kNames[] = {
      {"input_layernorm", "attn_norm"},    {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},
  };
  for (const auto& [hf, gguf] : kNames) {
    if (m[2] == hf) return "blk." + m[1].str() + "." + gguf + ".weight";
  }
  return std::nullopt;
}

StatusOr<at::Tensor> DequantizeGgufTensor(const GgufTensorInfo& t, const std::string& path) {
  std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
  int64_t numel = 1;
  for (int64_t d : t.dims) numel *= d;
  const auto where = [&] {
    return path + ": tensor `" + t.name + "` (" + GgufTypeName(t.type) + ")";
  };
  auto bs = GgufTypeBlockSize(t.type);
  if (!bs || t.nbytes != static_cast<uint64_t>(numel / bs->elements * bs->bytes) ||
      numel % bs->elements != 0) {
    if (!bs) return Status::Unimplemented(where() + ": unknown tensor type");
    return Status::InvalidArgument(where() + ": byte size does not match its shape");
  }
  try {
    at::Tensor out = at::empty(shape, at::kFloat);
    float* dst = out.data_ptr<float>();
    const int64_t blocks = numel / bs->elements;
    switch (static_cast<GgufType>(t.type)) {
      case GgufType::kF32:
        std::memcpy(dst, t.data, numel * 4);
        break;
      case GgufType::kF16:
        for (int64_t i = 0; i < numel; ++i) dst[i] = HalfAt(t.data + 2 * i);
        break;
      case GgufType::kBF16:
        for (int64_t i = 0; i < numel; ++i) {
          uint16_t bits;
          std::memcpy(&bits, t.data + 2 * i, 2);
          dst[i] = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
        }
        break;
      default: {
        const auto q = kernels::quant_type_from_ggml(t.type);
        if (!q) {
          return Status::Unimplemented(where() +
                                       ": unsupported type (F32, F16, BF16, Q8_0, Q4_0, "
                                       "Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K "
                                       "are)");
        }
        kernels::dequantize_row(*q, t.data, blocks * bs->elements, dst);
      }
    }
    return out;
  } catch (const c10::Error& e) {
    return Status::Internal(where() + ": " + e.what_without_backtrace());
  }
}

StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& f) {
  const std::string& src = f.path();
  ModelConfig c;
  auto arch = f.GetString("general.architecture");
  if (!arch) return Status::InvalidArgument(src + ": `general.architecture` missing");
  c.architecture = *arch;
  const std::string p = *arch + ".";
  auto required = [&](const std::string& key, int64_t* out) -> Status {
    auto v = f.GetInt(p + key);
    if (!v) return Status::InvalidArgument(src + ": metadata `" + p + key + "` missing");
    *out = *v;
    return Status::Ok();
  };
  if (c.architecture != "llama" && c.architecture != "mistral") {
    return Status::Unimplemented(src + ": architecture `" + c.architecture +
                                 "` is not supported (llama, mistral are)");
  }
  SNAPSERVE_RETURN_IF_ERROR(required("block_count", &c.num_layers));
  SNAPSERVE_RETURN_IF_ERROR(required("embedding_length", &c.hidden));
  SNAPSERVE_RETURN_IF_ERROR(required("feed_forward_length", &c.intermediate));
  SNAPSERVE_RETURN_IF_ERROR(required("attention.head_count", &c.num_heads));
  SNAPSERVE_RETURN_IF_ERROR(required("context_length", &c.max_context));
  c.num_kv_heads = f.GetInt(p + "attention.head_count_kv").value_or(c.num_heads);
  c.head_dim = c.num_heads > 0 ? c.hidden / c.num_heads : 0;
  c.head_dim = f.GetInt(p + "attention.key_length").value_or(c.head_dim);
  if (auto rot = f.GetInt(p + "rope.dimension_count"); rot && *rot != c.head_dim) {
    return Status::Unimplemented(src + ": partial rotary embeddings (rope.dimension_count " +
                                 std::to_string(*rot) + " != head_dim " +
                                 std::to_string(c.head_dim) + ") are not supported");
  }
  if (auto vocab = f.GetInt(p + "vocab_size")) {
    c.vocab = *vocab;
  } else if (const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
             embd && embd->dims.size() == 2) {
    c.vocab = embd->dims[1];
  }
  c.rope_theta = f.GetFloat(p + "rope.freq_base").value_or(10000.0);
  c.rms_norm_eps = f.GetFloat(p + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  c.sliding_window = f.GetInt(p + "attention.sliding_window").value_or(0);
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c.bos_token_id = f.GetInt("tokenizer.ggml.bos_token_id").value_or(-1);
  if (auto eos = f.GetInt("tokenizer.ggml.eos_token_id")) c.eos_token_ids.push_back(*eos);

  const std::string scaling = f.GetString(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling.kind = RopeScaling::Kind::kLinear;
    c.rope_scaling.factor = f.GetFloat(p + "rope.scaling.factor").value_or(1.0);
  } else if (auto legacy = f.GetFloat(p + "rope.scale_linear"); scaling == "none" && legacy) {
    c.rope_scaling.kind = RopeScaling::Kind::kLinear;
    c.rope_scaling.factor = *legacy;
  } else if (scaling != "none") {
    return Status::Unimplemented(src + ": rope scaling `" + scaling + "` is not supported");
  }
  // Llama 3.1-style files carry the llama3 adjustment as a tensor of divisors.
  if (const GgufTensorInfo* freqs = f.FindTensor("rope_freqs.weight")) {
    auto t = DequantizeGgufTensor(*freqs, src);
    if (!t.ok()) return t.status();
    const float* d = t->data_ptr<float>();
    c.rope_scaling.kind = RopeScaling::Kind::kFreqFactors;
    c.rope_scaling.freq_factors.assign(d, d + t->numel());
  }
  SNAPSERVE_RETURN_IF_ERROR(c.Validate(src));
  return c;
}

std::unique_ptr<WeightSource> OpenGgufWeights(std::shared_ptr<const GgufFile> file,
                                              const ModelConfig& config) {
  return std::make_unique<GgufWeightSource>(std::move(file), config);
}

}  // namespace snapserve::model
