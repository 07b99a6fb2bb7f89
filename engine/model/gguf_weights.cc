#include "engine/model/gguf_weights.h"

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

// Block formats (ggml-common.h). Each block holds 32 elements; element j of
// a 4-bit block is the low nibble of byte j (j < 16) or the high nibble of
// byte j - 16. Arithmetic in float32, in the same order as gguf-py's
// dequantizers, so the values equal what transformers loads bit for bit.
void DequantQ8_0(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b, src += 34, out += 32) {
    const float d = HalfAt(src);
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
  }
}

void DequantQ4_0(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b, src += 18, out += 32) {
    const float d = HalfAt(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
      out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void DequantQ4_1(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b, src += 20, out += 32) {
    const float d = HalfAt(src), m = HalfAt(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
      out[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
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
    auto g = GgufNameForHf(hf_name);
    if (!g) return Status::NotFound(file_->path() + ": no GGUF name for tensor `" + hf_name + "`");
    const GgufTensorInfo* t = file_->FindTensor(*g);
    if (t == nullptr) {
      return Status::NotFound(file_->path() + ": tensor `" + *g + "` (for `" + hf_name +
                              "`) not found");
    }
    auto f = DequantizeGgufTensor(*t, file_->path());
    if (!f.ok()) return f.status();
    try {
      at::Tensor w = std::move(f).value();
      const bool is_q = g->find(".attn_q.") != std::string::npos;
      const bool is_k = g->find(".attn_k.") != std::string::npos;
      if (is_q || is_k) {
        const int64_t heads = is_q ? config_.num_heads : config_.num_kv_heads;
        if (w.dim() != 2 || w.size(0) % (2 * heads) != 0) {
          return Status::InvalidArgument(file_->path() + ": tensor `" + *g + "` has " +
                                         std::to_string(w.dim() == 2 ? w.size(0) : -1) +
                                         " rows, not a multiple of 2 x " + std::to_string(heads) +
                                         " heads");
        }
        w = UnpermuteRows(w, heads);
      }
      return w.to(device, dtype, /*non_blocking=*/false, /*copy=*/false).contiguous();
    } catch (const c10::Error& e) {
      return Status::Internal(file_->path() + ": tensor `" + *g +
                              "`: conversion failed: " + e.what_without_backtrace());
    }
  }

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
      case GgufType::kQ8_0:
        DequantQ8_0(t.data, blocks, dst);
        break;
      case GgufType::kQ4_0:
        DequantQ4_0(t.data, blocks, dst);
        break;
      case GgufType::kQ4_1:
        DequantQ4_1(t.data, blocks, dst);
        break;
      default:
        return Status::Unimplemented(where() +
                                     ": unsupported type (F32, F16, BF16, Q8_0, Q4_0, Q4_1 are)");
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
