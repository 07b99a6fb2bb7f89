// Pre-tokenizers: split text into the pieces BPE runs on, exactly as the
// reference regexes do (HF tokenizers runs them with Oniguruma; llama.cpp has
// its own hand-written matchers). They are written by hand over code points
// rather than with a regex engine because std::regex has no \p{L}/\p{N} and
// the rules are small; each alternative of the regex is one branch below.
//
//  kGpt2   ByteLevel(use_regex=true):
//          's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  kLlama3 Split(regex) of Llama-3 ("llama-bpe"):
//          (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//  kSmolLM Digits(individual_digits=true) then kGpt2 on each non-digit piece:
//          the pre-tokenizer of SmolLM/SmolLM2's original tokenizer.json.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::tokenizer {

enum class PreTokenizerType { kGpt2, kLlama3, kSmolLM };

// Maps a GGUF `tokenizer.ggml.pre` name to a type; Unimplemented for others.
StatusOr<PreTokenizerType> PreTokenizerFromGgufName(std::string_view name);

// Splits `text` into consecutive pieces covering it exactly (views into text).
std::vector<std::string_view> PreTokenize(PreTokenizerType type, std::string_view text);

}  // namespace snapserve::tokenizer
