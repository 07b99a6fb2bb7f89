// Torch custom ops through which pytest drives the GGUF reader and the
// tokenizer against Python oracles (transformers, tokenizers, gguf-py).
// Loaded tokenizers are cached by path; errors surface as Python exceptions
// (TORCH_CHECK), except gguf_open_error, which returns the message.
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using snapserve::model::GgufFile;
using snapserve::tokenizer::Tokenizer;

// A path ending in ".gguf" loads from GGUF metadata, anything else is a
// Hugging Face tokenizer directory.
const Tokenizer& Load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(path);
  if (it != cache.end()) return *it->second;
  std::unique_ptr<Tokenizer> tok;
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) {
    auto file = GgufFile::Open(path);
    TORCH_CHECK(file.ok(), file.status().ToString());
    auto t = Tokenizer::FromGguf(**file);
    TORCH_CHECK(t.ok(), t.status().ToString());
    tok = std::move(t).value();
  } else {
    auto t = Tokenizer::FromHfDirectory(path);
    TORCH_CHECK(t.ok(), t.status().ToString());
    tok = std::move(t).value();
  }
  return *cache.emplace(path, std::move(tok)).first->second;
}

std::vector<int32_t> ToIds(const std::vector<int64_t>& ids) {
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int64_t> Tokenize(const std::string& path, const std::string& text, bool add_special,
                              bool split_special) {
  std::vector<int32_t> ids = Load(path).Encode(text, add_special, split_special);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string Detokenize(const std::string& path, const std::vector<int64_t>& ids,
                       bool skip_special) {
  return Load(path).Decode(ToIds(ids), skip_special);
}

std::vector<std::string> DetokenizeStream(const std::string& path,
                                          const std::vector<int64_t>& ids) {
  snapserve::tokenizer::IncrementalDecoder decoder(Load(path));
  std::vector<std::string> deltas;
  for (int64_t id : ids) deltas.push_back(decoder.Push(static_cast<int32_t>(id)));
  deltas.push_back(decoder.Flush());
  return deltas;
}

std::string ChatTemplate(const std::string& path, const std::vector<std::string>& roles,
                         const std::vector<std::string>& contents, bool add_generation_prompt) {
  TORCH_CHECK(roles.size() == contents.size(), "roles and contents differ in length");
  std::vector<snapserve::tokenizer::ChatMessage> messages;
  for (size_t i = 0; i < roles.size(); ++i) messages.push_back({roles[i], contents[i]});
  auto out = Load(path).ApplyChatTemplate(messages, add_generation_prompt);
  TORCH_CHECK(out.ok(), out.status().ToString());
  return *out;
}

// The ids the engine gives a chat request (Tokenizer::EncodeChat).
std::vector<int64_t> ChatTokenIds(const std::string& path, const std::vector<std::string>& roles,
                                  const std::vector<std::string>& contents,
                                  bool add_generation_prompt) {
  TORCH_CHECK(roles.size() == contents.size(), "roles and contents differ in length");
  std::vector<snapserve::tokenizer::ChatMessage> messages;
  for (size_t i = 0; i < roles.size(); ++i) messages.push_back({roles[i], contents[i]});
  auto ids = Load(path).EncodeChat(messages, add_generation_prompt);
  TORCH_CHECK(ids.ok(), ids.status().ToString());
  return std::vector<int64_t>(ids->begin(), ids->end());
}

std::vector<std::string> Pretokenize(const std::string& type, const std::string& text) {
  auto pre = snapserve::tokenizer::PreTokenizerFromGgufName(type);
  TORCH_CHECK(pre.ok(), pre.status().ToString());
  std::vector<std::string> out;
  for (std::string_view piece : snapserve::tokenizer::PreTokenize(*pre, text)) {
    out.emplace_back(piece);
  }
  return out;
}

std::string GgufOpenError(const std::string& path) {
  auto file = GgufFile::Open(path);
  return file.ok() ? "" : file.status().message();
}

// "name:TYPE:nbytes" for every tensor, so tests can check type names and sizes.
std::vector<std::string> GgufTensors(const std::string& path) {
  auto file = GgufFile::Open(path);
  TORCH_CHECK(file.ok(), file.status().ToString());
  std::vector<std::string> out;
  for (const auto& t : (*file)->tensors()) {
    out.push_back(t.name + ":" + snapserve::model::GgufTypeName(t.type) + ":" +
                  std::to_string(t.nbytes));
  }
  return out;
}

std::vector<int64_t> TokenizerInfo(const std::string& path) {
  const Tokenizer& t = Load(path);
  return {t.vocab_size(), t.bos_id(), t.eos_id(), t.add_bos() ? 1 : 0};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("tokenize(str path, str text, bool add_special, bool split_special=False) -> int[]",
        &Tokenize);
  m.def("detokenize(str path, int[] ids, bool skip_special=False) -> str", &Detokenize);
  m.def("detokenize_stream(str path, int[] ids) -> str[]", &DetokenizeStream);
  m.def("chat_template(str path, str[] roles, str[] contents, bool add_generation_prompt) -> str",
        &ChatTemplate);
  m.def(
      "chat_token_ids(str path, str[] roles, str[] contents, bool add_generation_prompt) -> int[]",
      &ChatTokenIds);
  m.def("pretokenize(str pre_type, str text) -> str[]", &Pretokenize);
  m.def("gguf_open_error(str path) -> str", &GgufOpenError);
  m.def("gguf_tensors(str path) -> str[]", &GgufTensors);
  m.def("tokenizer_info(str path) -> int[]", &TokenizerInfo);
}
