// Internal to engine/tokenizer: what the loaders (tokenizer_loader.cc for
// byte-level BPE, sentencepiece_loader.cc) share. TokenizerLoader is the one
// friend of Tokenizer that fills in its private state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/common/status_or.h"
#include "engine/tokenizer/tokenizer.h"

namespace snapserve::tokenizer {

class TokenizerLoader {
 public:
  static std::unique_ptr<Tokenizer> Make(std::unique_ptr<TokenizerModel> model);
  static void AddToken(Tokenizer* t, const std::string& text, int32_t id, bool special) {
    t->AddToken(text, id, special);
  }
  static void SetSpecialIds(Tokenizer* t, int32_t bos, int32_t eos, std::vector<int32_t> prefix,
                            std::vector<int32_t> suffix);
  static void SetChatTemplate(Tokenizer* t, const std::string& jinja);
  // The chat template of an HF directory: tokenizer_config.json's
  // chat_template (a string, or the "default" of a named list), else
  // chat_template.jinja. Sets nothing when there is none.
  static void SetChatTemplateFromDirectory(Tokenizer* t, const std::string& dir,
                                           const nlohmann::json& config);

  // SentencePiece tokenizer.model of an HF directory; `tokenizer_json` is the
  // directory's (non byte-level) tokenizer.json, or null (sentencepiece_loader.cc).
  static StatusOr<std::unique_ptr<Tokenizer>> FromSentencePieceDirectory(
      const std::string& dir, const nlohmann::json& tokenizer_json);
};

// A JSON file; when !required a missing file reads as null.
StatusOr<nlohmann::json> ReadJson(const std::string& path, bool required);
// j[key] when it is a string, else "".
std::string JsonString(const nlohmann::json& j, const char* key);
// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
std::string TokenContent(const nlohmann::json& config, const char* key);

}  // namespace snapserve::tokenizer
