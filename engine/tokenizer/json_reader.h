// Typed reads of the Hugging Face JSON files a tokenizer comes from
// (tokenizer.json, tokenizer_config.json). nlohmann::json throws type_error
// when a value has another type than asked for, and an uncaught exception
// aborts the server at startup; these reads return an INVALID_ARGUMENT that
// names the file and the field instead, e.g.
// ".../tokenizer.json: model.vocab: expected an object, got array".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/common/status_or.h"

namespace snapserve::tokenizer {

class JsonReader {
 public:
  // `file` names the file in every message.
  explicit JsonReader(std::string file) : file_(std::move(file)) {}

  // INVALID_ARGUMENT "<file>: <field>: <what>".
  Status Error(std::string_view field, std::string_view what) const;
  // "expected <expected>, got <j's type>" for `field`.
  Status WrongType(std::string_view field, std::string_view expected,
                   const nlohmann::json& j) const;

  // The member `key` of `parent`, whose own path is `where` ("" for the top
  // level): nullptr when `parent` lacks it or it is null; an error when it is
  // of another type. `parent` must be an object.
  StatusOr<const nlohmann::json*> Object(const nlohmann::json& parent, const char* key,
                                         std::string_view where) const;
  StatusOr<const nlohmann::json*> Array(const nlohmann::json& parent, const char* key,
                                        std::string_view where) const;
  StatusOr<std::optional<std::string>> String(const nlohmann::json& parent, const char* key,
                                              std::string_view where) const;
  StatusOr<std::optional<bool>> Bool(const nlohmann::json& parent, const char* key,
                                     std::string_view where) const;
  // An integer member: nullopt when absent or null.
  StatusOr<std::optional<int64_t>> Int(const nlohmann::json& parent, const char* key,
                                       std::string_view where) const;

  // `j` (at `field`) as a token id: an integer in [0, limit). `limit_name`
  // says what the limit is in the message ("the vocabulary size").
  StatusOr<int32_t> TokenId(const nlohmann::json& j, std::string_view field, int64_t limit,
                            std::string_view limit_name) const;

  // "model.vocab" from "model" and "vocab"; "vocab" from "" and "vocab".
  static std::string Path(std::string_view where, std::string_view key);

 private:
  StatusOr<const nlohmann::json*> Member(const nlohmann::json& parent, const char* key,
                                         std::string_view where, nlohmann::json::value_t type,
                                         std::string_view expected) const;

  std::string file_;
};

}  // namespace snapserve::tokenizer
