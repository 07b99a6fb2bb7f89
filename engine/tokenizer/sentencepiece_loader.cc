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
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/sentencepiece_model.h"
#include "engine/tokenizer/tokenizer_loader.h"

namespace snapserve::tokenizer {

using json = nlohmann::json;

namespace {

void AddTokensFrom(Tokenizer* t, const json& tokens) {
  if (tokens.is_array()) {  // tokenizer.json's added_tokens
    for (const json& a : tokens) {
      if (a.is_object()) {
        TokenizerLoader::AddToken(t, JsonString(a, "content"), a.value("id", -1),
                                  a.value("special", false));
      }
    }
  } else if (tokens.is_object()) {  // tokenizer_config.json's added_tokens_decoder: {"id": {...}}
    for (auto it = tokens.begin(); it != tokens.end(); ++it) {
      char* end = nullptr;
      long id = std::strtol(it.key().c_str(), &end, 10);
      if (end == it.key().c_str() || *end != '\0' || !it->is_object()) continue;
      TokenizerLoader::AddToken(t, JsonString(*it, "content"), static_cast<int32_t>(id),
                                it->value("special", false));
    }
  }
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
  if (tokenizer_json.is_object())
    AddTokensFrom(t.get(), tokenizer_json.value("added_tokens", json()));

  SNAPSERVE_ASSIGN_OR_RETURN(const json config, ReadJson(dir + "/tokenizer_config.json", false));
  const json& cfg = config.is_object() ? config : json::object();
  AddTokensFrom(t.get(), cfg.value("added_tokens_decoder", json()));

  int32_t bos = sp.bos_id(), eos = sp.eos_id();
  if (std::string s = TokenContent(cfg, "bos_token"); !s.empty()) bos = t->model_->Find(s);
  if (std::string s = TokenContent(cfg, "eos_token"); !s.empty()) eos = t->model_->Find(s);
  auto flag = [&](const char* key, bool fallback) {
    auto it = cfg.find(key);
    return it != cfg.end() && it->is_boolean() ? it->get<bool>() : fallback;
  };
  std::vector<int32_t> prefix, suffix;
  if (flag("add_bos_token", true) && bos >= 0) prefix.push_back(bos);
  if (flag("add_eos_token", false) && eos >= 0) suffix.push_back(eos);
  SetSpecialIds(t.get(), bos, eos, std::move(prefix), std::move(suffix));
  SetChatTemplateFromDirectory(t.get(), dir, cfg);
  return t;
}

}  // namespace snapserve::tokenizer
