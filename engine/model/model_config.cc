#include "engine/model/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/common/bounded_text.h"

namespace snapserve::model {
namespace {

using nlohmann::json;

// Reads an integer field; missing or null keeps `*out`.
Status ReadInt(const json& j, const char* key, int64_t* out, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer()) {
    return Status::InvalidArgument(source + ": `" + key + "` must be an integer");
  }
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status ReadDouble(const json& j, const char* key, double* out, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) {
    return Status::InvalidArgument(source + ": `" + key + "` must be a number");
  }
  *out = it->get<double>();
  return Status::Ok();
}

Status ParseRope(const json& rope, const std::string& source, ModelConfig* c) {
  if (!rope.is_object())
    return Status::InvalidArgument(source + ": rope parameters must be an object");
  SNAPSERVE_RETURN_IF_ERROR(ReadDouble(rope, "rope_theta", &c->rope_theta, source));
  std::string type = "default";
  // Older configs spell it `type`, newer ones `rope_type`.
  for (const char* key : {"rope_type", "type"}) {
    auto it = rope.find(key);
    if (it != rope.end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  RopeScaling& s = c->rope_scaling;
  if (type == "default") {
    s.kind = RopeScaling::Kind::kNone;
    return Status::Ok();
  }
  SNAPSERVE_RETURN_IF_ERROR(ReadDouble(rope, "factor", &s.factor, source));
  if (type == "linear") {
    s.kind = RopeScaling::Kind::kLinear;
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::kLlama3;
    SNAPSERVE_RETURN_IF_ERROR(ReadDouble(rope, "low_freq_factor", &s.low_freq_factor, source));
    SNAPSERVE_RETURN_IF_ERROR(ReadDouble(rope, "high_freq_factor", &s.high_freq_factor, source));
    s.original_max_position_embeddings = c->max_context;
    SNAPSERVE_RETURN_IF_ERROR(ReadInt(rope, "original_max_position_embeddings",
                                      &s.original_max_position_embeddings, source));
  } else {
    return Status::Unimplemented(source + ": rope type `" + Bounded(type) +
                                 "` is not supported (default, linear, llama3 are)");
  }
  return Status::Ok();
}

}  // namespace

Status ModelConfig::Validate(const std::string& source) const {
  auto bad = [&](const std::string& what) { return Status::InvalidArgument(source + ": " + what); };
  if (architecture != "llama" && architecture != "mistral") {
    return Status::Unimplemented(source + ": architecture `" + Bounded(architecture) +
                                 "` is not supported (llama, mistral are)");
  }
  // Upper bounds far above any released model (Llama 3.1 405B: 126 layers,
  // hidden 16384, intermediate 53248, 128 heads, vocab 128256) but low enough
  // that products of them (q rows, KV bytes per token, matrix sizes) cannot
  // overflow int64: a corrupt count fails here, naming the field, instead of
  // as a bad allocation later.
  struct Bound {
    const char* name;
    int64_t value;
    int64_t max;
  };
  const Bound bounds[] = {
      {"num_hidden_layers", num_layers, 1 << 12},
      {"hidden_size", hidden, 1 << 18},
      {"intermediate_size", intermediate, 1 << 20},
      {"num_attention_heads", num_heads, 1 << 12},
      {"num_key_value_heads", num_kv_heads, 1 << 12},
      {"head_dim", head_dim, 1 << 12},
      {"vocab_size", vocab, 1 << 24},
      {"max_position_embeddings", max_context, 1 << 26},
  };
  for (const Bound& b : bounds) {
    if (b.value <= 0 || b.value > b.max) {
      return bad(std::string(b.name) + " is " + std::to_string(b.value) + "; it must be in [1, " +
                 std::to_string(b.max) + "]");
    }
  }
  if (num_heads % num_kv_heads != 0) {
    return bad("num_key_value_heads (" + std::to_string(num_kv_heads) +
               ") must divide num_attention_heads (" + std::to_string(num_heads) + ")");
  }
  if (head_dim % 2 != 0) return bad("head_dim must be even (RoPE rotates pairs)");
  // An id the embedding has no row for: BOS would fail every prompt, an EOS
  // could never be sampled and generation would never stop on it.
  if (bos_token_id < -1 || bos_token_id >= vocab) {
    return bad("bos_token_id " + std::to_string(bos_token_id) +
               " is outside the vocabulary (vocab_size " + std::to_string(vocab) + ")");
  }
  for (int64_t eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab) {
      return bad("eos_token_id " + std::to_string(eos) + " is outside the vocabulary (vocab_size " +
                 std::to_string(vocab) + ")");
    }
  }
  // NaN and infinity pass a `<= 0` test; each would turn every logit into NaN.
  const auto positive_finite = [&](const char* name, double v) -> Status {
    if (std::isfinite(v) && v > 0) return Status::Ok();
    return bad(std::string(name) + " is " + std::to_string(v) + "; it must be finite and positive");
  };
  SNAPSERVE_RETURN_IF_ERROR(positive_finite("rope_theta", rope_theta));
  SNAPSERVE_RETURN_IF_ERROR(positive_finite("rms_norm_eps", rms_norm_eps));
  if (sliding_window < 0) return bad("sliding_window must not be negative");
  if (rope_scaling.kind != RopeScaling::Kind::kNone) {
    SNAPSERVE_RETURN_IF_ERROR(positive_finite("rope scaling factor", rope_scaling.factor));
  }
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    SNAPSERVE_RETURN_IF_ERROR(positive_finite("low_freq_factor", rope_scaling.low_freq_factor));
    SNAPSERVE_RETURN_IF_ERROR(positive_finite("high_freq_factor", rope_scaling.high_freq_factor));
  }
  for (float f : rope_scaling.freq_factors) {
    SNAPSERVE_RETURN_IF_ERROR(positive_finite("a rope_freqs entry", f));
  }
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3 &&
      (rope_scaling.original_max_position_embeddings <= 0 ||
       rope_scaling.high_freq_factor <= rope_scaling.low_freq_factor)) {
    return bad(
        "llama3 rope scaling needs original_max_position_embeddings > 0 and "
        "high_freq_factor > low_freq_factor");
  }
  if (rope_scaling.kind == RopeScaling::Kind::kFreqFactors &&
      static_cast<int64_t>(rope_scaling.freq_factors.size()) != head_dim / 2) {
    return bad("rope_freqs has " + std::to_string(rope_scaling.freq_factors.size()) +
               " entries, expected head_dim/2 = " + std::to_string(head_dim / 2));
  }
  return Status::Ok();
}

std::string ModelConfig::DebugString() const {
  std::ostringstream o;
  o << architecture << ": layers=" << num_layers << " hidden=" << hidden
    << " intermediate=" << intermediate << " heads=" << num_heads << " kv_heads=" << num_kv_heads
    << " head_dim=" << head_dim << " vocab=" << vocab << " ctx=" << max_context
    << " rope_theta=" << rope_theta << " rope_scaling=" << static_cast<int>(rope_scaling.kind)
    << " eps=" << rms_norm_eps << " tied=" << tie_word_embeddings
    << " sliding_window=" << sliding_window;
  return o.str();
}

StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source) {
  json j = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(source + ": not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument(source + ": top level must be an object");

  ModelConfig c;
  auto model_type = j.find("model_type");
  if (model_type == j.end() || !model_type->is_string()) {
    return Status::InvalidArgument(source + ": `model_type` missing");
  }
  c.architecture = model_type->get<std::string>();
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", &c.num_layers, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "hidden_size", &c.hidden, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", &c.intermediate, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", &c.num_heads, source));
  c.num_kv_heads = c.num_heads;  // transformers' default when the key is absent
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", &c.num_kv_heads, source));
  if (c.num_heads > 0) c.head_dim = c.hidden / c.num_heads;
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "head_dim", &c.head_dim, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "vocab_size", &c.vocab, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", &c.max_context, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c.rope_theta, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "sliding_window", &c.sliding_window, source));
  SNAPSERVE_RETURN_IF_ERROR(ReadInt(j, "bos_token_id", &c.bos_token_id, source));
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) {
    c.tie_word_embeddings = it->get<bool>();
  }
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int64_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) {
          return Status::InvalidArgument(source + ": `eos_token_id` entries must be integers");
        }
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    }
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (auto it = j.find(key); it != j.end() && it->is_boolean() && it->get<bool>()) {
      return Status::Unimplemented(source + ": `" + key + "`=true is not supported");
    }
  }
  if (auto it = j.find("hidden_act"); it != j.end() && it->is_string() && *it != "silu") {
    return Status::Unimplemented(source + ": hidden_act `" + Bounded(it->get<std::string>()) +
                                 "` is not supported (silu is)");
  }
  // transformers 5 writes `rope_parameters` (theta inside); older files
  // `rope_scaling` next to a top-level `rope_theta`.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      SNAPSERVE_RETURN_IF_ERROR(ParseRope(*it, source + " (" + key + ")", &c));
      break;
    }
  }
  SNAPSERVE_RETURN_IF_ERROR(c.Validate(source));
  return c;
}

StatusOr<ModelConfig> LoadHfConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return ParseHfConfig(text.str(), path);
}

}  // namespace snapserve::model
