// Builds a Tokenizer for a Hugging Face directory with a SentencePiece
// tokenizer.model (Llama-2, Mistral-7B-v0.1), as transformers' fast tokenizer
// with the legacy Llama rules sees it:
// - ids of ordinary text come from the sentencepiece library (the model's own
//   normalization, dummy prefix and byte fallback). The directory's
//   tokenizer.json, when there is one, is HF's conversion of this file; it is
//   read only for its added tokens (where a conversion and the original
//   disagree, snapserve follows the original; docs/testing-and-measuring.md,
//   "Oracles, not self-agreement").
// - control pieces (<s>, </s>) and the unknown piece are special added tokens
//   matched in the text, as HF's conversion declares them; every stretch of
//   text between added tokens gets its own dummy prefix ("legacy" rules: the
//   normalizer Prepend("▁") + Replace(" ", "▁") of the original Llama-2 and
//   Mistral-7B-v0.1 tokenizer.json files, and what the library does when
//   each stretch is encoded on its own). tokenizer_config.json's `legacy` flag
//   is not read.
// - BOS/EOS from tokenizer_config.json (add_bos_token defaults to true and
//   add_eos_token to false, as LlamaTokenizer's), else the model's own ids.
#include <cerrno>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "engine/common/bounded_text.h"
#include "engine/tokenizer/sentencepiece_model.h"
#include "engine/tokenizer/tokenizer_loader.h"

namespace snapserve::tokenizer {

using json = nlohmann::json;

namespace {

// tokenizer_config.json's added_tokens_decoder: {"<id>": {"content": ..., "special": ...}}.
Status AddTokensFromDecoder(Tokenizer* t, const JsonReader& in, const json& config) {
  SNAPSERVE_ASSIGN_OR_RETURN(const json* decoder, in.Object(config, "added_tokens_decoder", ""));
  if (decoder == nullptr) return Status::Ok();
  for (auto it = decoder->begin(); it != decoder->end(); ++it) {
    const std::string field = "added_tokens_decoder[\"" + Bounded(it.key(), 64) + "\"]";
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(it.key().c_str(), &end, 10);
    if (end == it.key().c_str() || *end != '\0' || errno != 0 || id < 0 || id >= t->vocab_size()) {
      return in.Error(field, "the key must be a token id below the SentencePiece model's size " +
                                 std::to_string(t->vocab_size()));
    }
    if (!it->is_object()) return in.WrongType(field, "an object", *it);
    SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<std::string> content,
                               in.String(*it, "content", field));
    SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> special, in.Bool(*it, "special", field));
    TokenizerLoader::AddToken(t, content.value_or(""), static_cast<int32_t>(id),
                              special.value_or(false));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> TokenizerLoader::FromSentencePieceDirectory(
    const std::string& dir, const json& tokenizer_json) {
  SNAPSERVE_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceModel> loaded,
                             SentencePieceModel::Load(dir + "/tokenizer.model"));
  const SentencePieceModel& sp = *loaded;
  std::unique_ptr<Tokenizer> t = Make(std::move(loaded));
  for (int32_t id = 0; id < sp.size(); ++id) {
    if (sp.IsSpecialPiece(id)) AddToken(t.get(), std::string(sp.TokenText(id)), id, true);
  }
  if (tokenizer_json.is_object()) {
    // Added tokens past the SentencePiece model have no id this tokenizer can
    // produce: refused rather than silently dropped.
    SNAPSERVE_ASSIGN_OR_RETURN(const std::vector<AddedTokenEntry> added,
                               ReadAddedTokens(JsonReader(dir + "/tokenizer.json"), tokenizer_json,
                                               t->vocab_size(), "the SentencePiece model's size"));
    for (const AddedTokenEntry& a : added) AddToken(t.get(), a.content, a.id, a.special);
  }

  const std::string config_path = dir + "/tokenizer_config.json";
  SNAPSERVE_ASSIGN_OR_RETURN(const json config, ReadJson(config_path, false));
  const JsonReader in(config_path);
  const json& cfg = config.is_object() ? config : json::object();
  SNAPSERVE_RETURN_IF_ERROR(AddTokensFromDecoder(t.get(), in, cfg));

  int32_t bos = sp.bos_id(), eos = sp.eos_id();
  SNAPSERVE_ASSIGN_OR_RETURN(const std::string bos_text, TokenContent(in, cfg, "bos_token"));
  SNAPSERVE_ASSIGN_OR_RETURN(const std::string eos_text, TokenContent(in, cfg, "eos_token"));
  if (!bos_text.empty()) bos = t->model_->Find(bos_text);
  if (!eos_text.empty()) eos = t->model_->Find(eos_text);
  SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> add_bos, in.Bool(cfg, "add_bos_token", ""));
  SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> add_eos, in.Bool(cfg, "add_eos_token", ""));
  std::vector<int32_t> prefix, suffix;
  if (add_bos.value_or(true) && bos >= 0) prefix.push_back(bos);
  if (add_eos.value_or(false) && eos >= 0) suffix.push_back(eos);
  SetSpecialIds(t.get(), bos, eos, std::move(prefix), std::move(suffix));
  SNAPSERVE_RETURN_IF_ERROR(SetChatTemplateFromDirectory(t.get(), dir, in, cfg));
  return t;
}

}  // namespace snapserve::tokenizer
