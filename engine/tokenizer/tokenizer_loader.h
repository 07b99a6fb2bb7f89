// Internal to engine/tokenizer: what the loaders (tokenizer_loader.cc for
// byte-level BPE, sentencepiece_loader.cc) share. TokenizerLoader is the one
// friend of Tokenizer that fills in its private state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/common/status_or.h"
#include "engine/tokenizer/json_reader.h"
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
  // chat_template.jinja. Sets nothing when there is none; an error when
  // chat_template has another type. `in` reads `config`.
  static Status SetChatTemplateFromDirectory(Tokenizer* t, const std::string& dir,
                                             const JsonReader& in, const nlohmann::json& config);

  // Tokenizer::FromHfDirectory without its exception backstop.
  static StatusOr<std::unique_ptr<Tokenizer>> FromHfDirectory(const std::string& dir);
  // SentencePiece tokenizer.model of an HF directory; `tokenizer_json` is the
  // directory's (non byte-level) tokenizer.json, or null (sentencepiece_loader.cc).
  static StatusOr<std::unique_ptr<Tokenizer>> FromSentencePieceDirectory(
      const std::string& dir, const nlohmann::json& tokenizer_json);
};

// A JSON file holding an object; when !required a missing file reads as null.
StatusOr<nlohmann::json> ReadJson(const std::string& path, bool required);
// j[key] when it is a string, else "".
std::string JsonString(const nlohmann::json& j, const char* key);
// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...};
// "" when absent, an error naming the field for any other type.
StatusOr<std::string> TokenContent(const JsonReader& in, const nlohmann::json& config,
                                   const char* key);

// One entry of tokenizer.json's added_tokens.
struct AddedTokenEntry {
  int32_t id;
  std::string content;
  bool special;
};
// tokenizer.json's added_tokens (none when absent): objects with an integer
// `id` below `limit` (described as `limit_name` in errors), a string
// `content` and an optional boolean `special`.
StatusOr<std::vector<AddedTokenEntry>> ReadAddedTokens(const JsonReader& in,
                                                       const nlohmann::json& tokenizer,
                                                       int64_t limit, std::string_view limit_name);

// config.json's vocab_size in `dir` when it has one: the rows of the model's
// embedding, which every id the tokenizer can produce must be below. The
// model loader reads and checks config.json itself; this only looks.
std::optional<int64_t> ModelVocabSize(const std::string& dir);

}  // namespace snapserve::tokenizer
