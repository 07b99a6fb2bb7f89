#include "engine/model/synthetic_weights.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <map>
#include <mutex>
#include <regex>

#include "engine/common/bounded_text.h"
#include "kernels/quant/quant_matrix.h"
#include "kernels/quant/random_blocks.h"

namespace snapserve::model {
namespace {

constexpr char kPrefix[] = "synthetic:";
constexpr float kWeightStd = 0.02f;
// Work items of the parallel fill; a chunk's bytes depend only on its seed.
constexpr int64_t kChunkBlocks = 2048;
constexpr int64_t kChunkElements = 1 << 16;

// The public config.json of each model (Hugging Face hub, as of 2025).
// max_context, rope scaling, bos/eos as there; tokens are never decoded.
ModelConfig Llama(int64_t layers, int64_t hidden, int64_t intermediate, int64_t heads,
                  int64_t kv_heads, int64_t head_dim, int64_t vocab, bool tied, double theta,
                  int64_t max_context) {
  ModelConfig c;
  c.architecture = "llama";
  c.num_layers = layers;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab = vocab;
  c.tie_word_embeddings = tied;
  c.rope_theta = theta;
  c.max_context = max_context;
  c.rms_norm_eps = 1e-5;
  return c;
}

// Llama 3.1 / 3.2's rope_scaling {"rope_type": "llama3", ...}.
ModelConfig WithLlama3Rope(ModelConfig c, double factor) {
  c.rope_scaling.kind = RopeScaling::Kind::kLlama3;
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  return c;
}

const std::map<std::string, ModelConfig>& Presets() {
  static const auto* kPresets = [] {
    auto* p = new std::map<std::string, ModelConfig>;
    // HuggingFaceTB/SmolLM2-135M(-Instruct)
    ModelConfig smol = Llama(30, 576, 1536, 9, 3, 64, 49152, true, 100000.0, 8192);
    smol.bos_token_id = 1;
    smol.eos_token_ids = {2};
    (*p)["smollm2-135m"] = smol;
    // meta-llama/Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B
    (*p)["llama-3.2-1b"] =
        WithLlama3Rope(Llama(16, 2048, 8192, 32, 8, 64, 128256, true, 500000.0, 131072), 32.0);
    (*p)["llama-3.2-3b"] =
        WithLlama3Rope(Llama(28, 3072, 8192, 24, 8, 128, 128256, true, 500000.0, 131072), 32.0);
    (*p)["llama-3.1-8b"] =
        WithLlama3Rope(Llama(32, 4096, 14336, 32, 8, 128, 128256, false, 500000.0, 131072), 8.0);
    // mistralai/Mistral-7B-v0.3 (no sliding window)
    ModelConfig mistral = Llama(32, 4096, 14336, 32, 8, 128, 32768, false, 1000000.0, 32768);
    mistral.architecture = "mistral";
    mistral.bos_token_id = 1;
    mistral.eos_token_ids = {2};
    (*p)["mistral-7b"] = mistral;
    return p;
  }();
  return *kPresets;
}

struct Format {
  const char* name;
  std::optional<kernels::QuantType> block;
  at::ScalarType dense;  // when !block
};

const std::vector<Format>& Formats() {
  using kernels::QuantType;
  static const std::vector<Format> kFormats = {
      {"f32", std::nullopt, at::kFloat},      {"bf16", std::nullopt, at::kBFloat16},
      {"f16", std::nullopt, at::kHalf},       {"q8_0", QuantType::kQ8_0, at::kFloat},
      {"q4_0", QuantType::kQ4_0, at::kFloat}, {"q4_1", QuantType::kQ4_1, at::kFloat},
      {"q5_0", QuantType::kQ5_0, at::kFloat}, {"q5_1", QuantType::kQ5_1, at::kFloat},
      {"q4_k", QuantType::kQ4_K, at::kFloat}, {"q5_k", QuantType::kQ5_K, at::kFloat},
      {"q6_k", QuantType::kQ6_K, at::kFloat},
  };
  return kFormats;
}

const Format* FindFormat(const std::string& name) {
  for (const Format& f : Formats()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string Choices() {
  std::string out = "presets:";
  for (const auto& [name, _] : Presets()) out += " " + name;
  out += "; formats:";
  for (const Format& f : Formats()) out += std::string(" ") + f.name;
  return out;
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// The float16 scale standard deviation that gives decoded weights an RMS of
// kWeightStd: measured once per type on blocks with unit scales (the RMS is
// linear in the scales).
float HalfStddev(kernels::QuantType type) {
  static std::mutex mu;
  static std::map<kernels::QuantType, float> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(type);
  if (it != cache.end()) return it->second;
  const kernels::QuantFormat& f = kernels::quant_format(type);
  const int64_t blocks = 256;
  std::vector<uint8_t> data(static_cast<size_t>(blocks * f.block_bytes));
  std::vector<float> values(static_cast<size_t>(blocks * f.block_elements));
  kernels::random_blocks(type, /*seed=*/1, 1.0f, blocks, data.data());
  kernels::dequantize_row(type, data.data(), blocks * f.block_elements, values.data());
  double sum_sq = 0;
  for (float v : values) sum_sq += static_cast<double>(v) * v;
  const float rms = static_cast<float>(std::sqrt(sum_sq / static_cast<double>(values.size())));
  return cache[type] = kWeightStd / rms;
}

template <typename Store, typename Round>
void FillNormal(Store* dst, int64_t n, uint64_t seed) {
  const int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      kernels::SplitMix64 rng(kernels::mix_seed(seed, static_cast<uint64_t>(c)));
      const int64_t stop = std::min(n, (c + 1) * kChunkElements);
      for (int64_t i = c * kChunkElements; i < stop; ++i) {
        dst[i] = static_cast<Store>(static_cast<float>(Round(kWeightStd * rng.approx_normal())));
      }
    }
  });
}

// `out` (CPU, contiguous, float32/bfloat16/float16) filled with ~N(0, 0.02)
// values rounded to `format`.
void FillDense(at::Tensor& out, at::ScalarType format, uint64_t seed) {
  const int64_t n = out.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "synthetic", [&] {
    auto* dst = out.data_ptr<scalar_t>();
    switch (format) {
      case at::kBFloat16:
        FillNormal<scalar_t, c10::BFloat16>(dst, n, seed);
        break;
      case at::kHalf:
        FillNormal<scalar_t, c10::Half>(dst, n, seed);
        break;
      default:
        FillNormal<scalar_t, float>(dst, n, seed);
    }
  });
}

class SyntheticWeightSource : public WeightSource {
 public:
  explicit SyntheticWeightSource(SyntheticSpec spec) : spec_(std::move(spec)) {}

  bool Has(const std::string& hf_name) const override { return Shape(hf_name).has_value(); }

  std::string Where(const std::string& /*hf_name*/) const override {
    return kPrefix + spec_.preset + "?format=" + spec_.format +
           "&seed=" + std::to_string(spec_.seed);
  }

  StatusOr<at::Tensor> Load(const std::string& hf_name, at::ScalarType dtype,
                            at::Device device) override {
    auto shape = Find(hf_name);
    if (!shape.ok()) return shape.status();
    try {
      if (shape->size() == 1) return at::ones(*shape, at::TensorOptions(dtype).device(device));
      const int64_t cols = (*shape)[1];
      if (auto type = spec_.BlockType(cols)) {
        auto blocks = Blocks(hf_name, *type, (*shape)[0], cols);
        if (!blocks.ok()) return blocks.status();
        return kernels::dequantize(*blocks).to(device, dtype);
      }
      at::Tensor out = at::empty(*shape, at::TensorOptions(dtype));
      FillDense(out, *spec_.DenseType(), TensorSeed(hf_name));
      return out.to(device);
    } catch (const c10::Error& e) {
      return Status::Internal(Where(hf_name) + ": tensor `" + hf_name +
                              "`: " + e.what_without_backtrace());
    }
  }

  StatusOr<LinearWeight> LoadLinear(const std::string& hf_name, at::ScalarType dtype,
                                    at::Device device) override {
    auto shape = Find(hf_name);
    if (!shape.ok()) return shape.status();
    const auto type = shape->size() == 2 ? spec_.BlockType((*shape)[1]) : std::nullopt;
    if (!device.is_cpu() || !type) return WeightSource::LoadLinear(hf_name, dtype, device);
    auto blocks = Blocks(hf_name, *type, (*shape)[0], (*shape)[1]);
    if (!blocks.ok()) return blocks.status();
    LinearWeight w;
    w.parts.push_back(std::move(blocks).value());
    return w;
  }

 private:
  uint64_t TensorSeed(const std::string& hf_name) const {
    return kernels::mix_seed(spec_.seed, Fnv1a(hf_name));
  }

  StatusOr<kernels::QuantMatrix> Blocks(const std::string& hf_name, kernels::QuantType type,
                                        int64_t rows, int64_t cols) const {
    const kernels::QuantFormat& f = kernels::quant_format(type);
    if (cols % f.block_elements != 0) {
      return Status::InvalidArgument(Where(hf_name) + ": tensor `" + hf_name + "` has rows of " +
                                     std::to_string(cols) + " elements, not a whole number of " +
                                     std::to_string(f.block_elements) + "-element " + f.name +
                                     " blocks");
    }
    try {
      const int64_t blocks = rows * (cols / f.block_elements);
      at::Tensor data = at::empty({rows, cols / f.block_elements * f.block_bytes}, at::kByte);
      uint8_t* p = data.data_ptr<uint8_t>();
      const uint64_t seed = TensorSeed(hf_name);
      const float half_std = HalfStddev(type);
      const int64_t chunks = (blocks + kChunkBlocks - 1) / kChunkBlocks;
      at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const int64_t first = c * kChunkBlocks;
          kernels::random_blocks(type, kernels::mix_seed(seed, static_cast<uint64_t>(c)), half_std,
                                 std::min(kChunkBlocks, blocks - first), p + first * f.block_bytes);
        }
      });
      return kernels::make_quant_matrix(type, rows, cols, std::move(data), hf_name.c_str());
    } catch (const c10::Error& e) {
      return Status::Internal(Where(hf_name) + ": tensor `" + hf_name +
                              "`: " + e.what_without_backtrace());
    }
  }

  StatusOr<std::vector<int64_t>> Find(const std::string& hf_name) const {
    auto shape = Shape(hf_name);
    if (!shape) return Status::NotFound(Where(hf_name) + ": no tensor `" + hf_name + "`");
    return *shape;
  }

  // The HF tensor's shape in this preset, or nullopt if it has no such tensor.
  std::optional<std::vector<int64_t>> Shape(const std::string& hf_name) const {
    const ModelConfig& c = spec_.config;
    const int64_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
    if (hf_name == "model.embed_tokens.weight") return std::vector<int64_t>{c.vocab, c.hidden};
    if (hf_name == "lm_head.weight" && !c.tie_word_embeddings) {
      return std::vector<int64_t>{c.vocab, c.hidden};
    }
    if (hf_name == "model.norm.weight") return std::vector<int64_t>{c.hidden};
    static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.+)\.weight)");
    std::smatch m;
    if (!std::regex_match(hf_name, m, layer_re) || std::stoll(m[1].str()) >= c.num_layers) {
      return std::nullopt;
    }
    const std::map<std::string, std::vector<int64_t>> shapes = {
        {"input_layernorm", {c.hidden}},
        {"post_attention_layernorm", {c.hidden}},
        {"self_attn.q_proj", {q_rows, c.hidden}},
        {"self_attn.k_proj", {kv_rows, c.hidden}},
        {"self_attn.v_proj", {kv_rows, c.hidden}},
        {"self_attn.o_proj", {c.hidden, q_rows}},
        {"mlp.gate_proj", {c.intermediate, c.hidden}},
        {"mlp.up_proj", {c.intermediate, c.hidden}},
        {"mlp.down_proj", {c.hidden, c.intermediate}},
    };
    auto it = shapes.find(m[2].str());
    if (it == shapes.end()) return std::nullopt;
    return it->second;
  }

  SyntheticSpec spec_;
};

}  // namespace

std::optional<kernels::QuantType> SyntheticSpec::BlockType(int64_t cols) const {
  const Format* f = FindFormat(format);
  if (f == nullptr || !f->block) return std::nullopt;
  using kernels::QuantType;
  const QuantType t = *f->block;
  if (cols % kernels::quant_format(t).block_elements == 0) return t;
  switch (t) {  // llama-quant.cpp's fallback for rows not of whole super-blocks
    case QuantType::kQ4_K:
      return QuantType::kQ5_0;
    case QuantType::kQ5_K:
      return QuantType::kQ5_1;
    case QuantType::kQ6_K:
      return QuantType::kQ8_0;
    default:
      return t;  // rejected, naming the tensor, when its blocks are made
  }
}

std::optional<at::ScalarType> SyntheticSpec::DenseType() const {
  const Format* f = FindFormat(format);
  if (f == nullptr || f->block) return std::nullopt;
  return f->dense;
}

bool IsSyntheticSpec(const std::string& path) { return path.rfind(kPrefix, 0) == 0; }

StatusOr<SyntheticSpec> ParseSyntheticSpec(const std::string& text) {
  const auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("model `" + text + "`: " + what +
                                   " (expected synthetic:<preset>[?format=<format>][&seed=<n>]; " +
                                   Choices() + ")");
  };
  if (!IsSyntheticSpec(text)) return bad("not a synthetic model");
  SyntheticSpec spec;
  const std::string rest = text.substr(sizeof(kPrefix) - 1);
  const size_t q = rest.find('?');
  spec.preset = rest.substr(0, q);
  auto preset = Presets().find(spec.preset);
  if (preset == Presets().end()) return bad("unknown preset `" + Bounded(spec.preset) + "`");
  spec.config = preset->second;
  bool seen_format = false, seen_seed = false;
  for (size_t start = q; start != std::string::npos;) {
    const size_t end = rest.find('&', start + 1);
    const std::string param =
        rest.substr(start + 1, end == std::string::npos ? end : end - start - 1);
    start = end;
    const size_t eq = param.find('=');
    const std::string key = param.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : param.substr(eq + 1);
    if (key == "format" && !seen_format) {
      if (FindFormat(value) == nullptr) return bad("unknown format `" + Bounded(value) + "`");
      spec.format = value;
      seen_format = true;
    } else if (key == "seed" && !seen_seed) {
      if (value.empty() || value.size() > 20 ||
          value.find_first_not_of("0123456789") != std::string::npos) {
        return bad("seed `" + value + "` is not an unsigned integer");
      }
      try {
        spec.seed = std::stoull(value);
      } catch (const std::out_of_range&) {
        return bad("seed `" + value + "` does not fit 64 bits");
      }
      seen_seed = true;
    } else {
      return bad("unexpected or repeated parameter `" + param + "`");
    }
  }
  SNAPSERVE_RETURN_IF_ERROR(spec.config.Validate(text));
  return spec;
}

std::unique_ptr<WeightSource> OpenSyntheticWeights(const SyntheticSpec& spec) {
  return std::make_unique<SyntheticWeightSource>(spec);
}

int64_t SyntheticDecodeBytes(const SyntheticSpec& spec, at::ScalarType dtype) {
  const ModelConfig& c = spec.config;
  const auto bytes = [&](int64_t rows, int64_t cols) -> int64_t {
    if (auto t = spec.BlockType(cols)) {
      const kernels::QuantFormat& f = kernels::quant_format(*t);
      return rows * (cols / f.block_elements) * f.block_bytes;
    }
    return rows * cols * static_cast<int64_t>(c10::elementSize(dtype));
  };
  const int64_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
  const int64_t layer = bytes(q_rows + 2 * kv_rows, c.hidden) + bytes(c.hidden, q_rows) +
                        bytes(2 * c.intermediate, c.hidden) + bytes(c.hidden, c.intermediate);
  return c.num_layers * layer + bytes(c.vocab, c.hidden);
}

}  // namespace snapserve::model
