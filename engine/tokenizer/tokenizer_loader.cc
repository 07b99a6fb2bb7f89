// Builds a byte-level BPE Tokenizer from GGUF metadata or from a Hugging Face
// tokenizer.json (directories with a SentencePiece tokenizer.model go to
// sentencepiece_loader.cc). Only what the runtime supports is accepted
// (byte-level BPE with a known pre-tokenizer, no normalizer); anything else is
// an error naming the field, never a tokenizer that silently produces
// different ids.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/common/bounded_text.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/tokenizer_loader.h"
#include "engine/tokenizer/unicode.h"

namespace snapserve::tokenizer {

using json = nlohmann::json;

// The Llama-3 split regex exactly as tokenizer.json spells it.
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// llama.cpp's token types (tokenizer.ggml.token_type, its llama_token_type):
// 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
// 6 byte. Only control and user-defined change how text is split.
enum GgufTokenType : int64_t { kControl = 3, kUserDefined = 4, kLastTokenType = 6 };

namespace {

// Offset of the first byte of `text` that starts no valid UTF-8 sequence, or
// npos when all of it is valid.
size_t FirstInvalidUtf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    bool incomplete = false;
    const size_t n = ValidSequenceLength(text.substr(at), &incomplete);
    if (n == 0) return at;
    at += n;
  }
  return std::string_view::npos;
}

// GGUF strings are UTF-8 (a byte-level BPE token never holds anything else),
// and a token type outside llama.cpp's enum means nothing: either is a
// corrupt vocabulary. Accepted, a control token whose type was corrupted to
// such a value would be read as plain text and every prompt holding it would
// tokenize differently; refused, the load fails with the entry named. A type
// corrupted into another valid one (3 <-> 1) stays undetectable.
Status CheckGgufVocabulary(const std::vector<std::string>& tokens,
                           const std::optional<std::vector<int64_t>>& types) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (const size_t bad = FirstInvalidUtf8(tokens[i]); bad != std::string_view::npos) {
      static constexpr char kHex[] = "0123456789abcdef";
      const auto byte = static_cast<unsigned char>(tokens[i][bad]);
      return Status::InvalidArgument("tokenizer.ggml.tokens[" + std::to_string(i) +
                                     "] is not valid UTF-8 (byte 0x" + kHex[byte >> 4] +
                                     kHex[byte & 15] + " at offset " + std::to_string(bad) + ")");
    }
  }
  for (size_t i = 0; types && i < types->size(); ++i) {
    const int64_t type = (*types)[i];
    if (type < 0 || type > kLastTokenType) {
      return Status::InvalidArgument(
          "tokenizer.ggml.token_type[" + std::to_string(i) + "] is " + std::to_string(type) +
          ", not a llama.cpp token type (0 undefined, 1 normal, 2 unknown, 3 control, "
          "4 user-defined, 5 unused, 6 byte)");
    }
  }
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Tokenizer> TokenizerLoader::Make(std::unique_ptr<TokenizerModel> model) {
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(model)));
  t->special_.assign(static_cast<size_t>(t->vocab_size()), false);
  t->chat_template_error_ = Status::NotFound("the model has no chat template");
  return t;
}

void TokenizerLoader::SetSpecialIds(Tokenizer* t, int32_t bos, int32_t eos,
                                    std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
  auto valid = [&](int32_t id) { return id >= 0 && id < t->vocab_size() ? id : -1; };
  t->bos_id_ = valid(bos);
  t->eos_id_ = valid(eos);
  t->add_bos_ = !prefix.empty() && prefix.front() == t->bos_id_ && t->bos_id_ >= 0;
  t->prefix_ids_ = std::move(prefix);
  t->suffix_ids_ = std::move(suffix);
}

void TokenizerLoader::SetChatTemplate(Tokenizer* t, const std::string& jinja) {
  std::string bos(t->TokenText(t->bos_id_)), eos(t->TokenText(t->eos_id_));
  StatusOr<ChatTemplate> ct = ChatTemplate::Detect(jinja, bos, eos);
  if (ct.ok()) {
    t->chat_template_ = std::make_unique<ChatTemplate>(std::move(ct).value());
  } else {
    t->chat_template_error_ = ct.status();
  }
}

Status TokenizerLoader::SetChatTemplateFromDirectory(Tokenizer* t, const std::string& dir,
                                                     const JsonReader& in, const json& cfg) {
  std::string jinja;
  const auto it = cfg.find("chat_template");
  if (it != cfg.end() && it->is_string()) {
    jinja = it->get<std::string>();
  } else if (it != cfg.end() && it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& named = (*it)[i];
      const std::string field = "chat_template[" + std::to_string(i) + "]";
      if (!named.is_object()) return in.WrongType(field, "an object {name, template}", named);
      SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<std::string> name,
                                 in.String(named, "name", field));
      SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<std::string> text,
                                 in.String(named, "template", field));
      if (name == "default") jinja = text.value_or("");
    }
  } else if (it != cfg.end() && !it->is_null()) {
    return in.WrongType("chat_template", "a string or an array of {name, template}", *it);
  } else if (std::ifstream file(dir + "/chat_template.jinja"); file) {
    std::stringstream buf;
    buf << file.rdbuf();
    jinja = buf.str();
  }
  if (!jinja.empty()) SetChatTemplate(t, jinja);
  return Status::Ok();
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const model::GgufFile& gguf) {
  auto error = [&](const std::string& what) {
    return Status::InvalidArgument(gguf.path() + ": " + what);
  };
  std::optional<std::string> model = gguf.GetString("tokenizer.ggml.model");
  if (!model) return error("no tokenizer.ggml.model");
  if (*model == "llama") {
    // A SentencePiece vocabulary as GGUF arrays: running it through the
    // sentencepiece library would mean building its ModelProto (protobuf)
    // inside the engine, which never links protobuf (docs/architecture.md, "Build
    // targets and dependencies").
    return Status::InvalidArgument(
        gguf.path() +
        ": tokenizer.ggml.model 'llama' (a SentencePiece vocabulary stored in GGUF metadata) "
        "is not supported; supported are byte-level BPE GGUF files (tokenizer.ggml.model "
        "'gpt2') and Hugging Face directories with tokenizer.json or a SentencePiece "
        "tokenizer.model");
  }
  if (*model != "gpt2") {
    return Status::Unimplemented(gguf.path() + ": tokenizer model '" + Bounded(*model) +
                                 "' is not supported (only byte-level BPE, 'gpt2')");
  }
  std::optional<std::vector<std::string>> tokens = gguf.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) return error("no tokenizer.ggml.tokens");
  std::optional<std::vector<std::string>> merge_lines =
      gguf.GetStringArray("tokenizer.ggml.merges");
  if (!merge_lines) return error("no tokenizer.ggml.merges");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merge_lines->size());
  for (const std::string& line : *merge_lines) {
    size_t space = line.find(' ', 1);  // as llama.cpp: a token may start with ' '
    if (space == std::string::npos) return error("bad merge '" + Bounded(line) + "'");
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  std::string pre_name = gguf.GetString("tokenizer.ggml.pre").value_or("default");
  StatusOr<PreTokenizerType> pre = PreTokenizerFromGgufName(pre_name);
  if (!pre.ok()) return Status(pre.status().code(), gguf.path() + ": " + pre.status().message());
  // llama.cpp treats whole-word vocabulary hits as final for Llama-3, which
  // matches its tokenizer.json's "ignore_merges": true.
  bool ignore_merges = *pre == PreTokenizerType::kLlama3;

  std::optional<std::vector<int64_t>> types = gguf.GetIntArray("tokenizer.ggml.token_type");
  if (types && types->size() != tokens->size()) {
    return error("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length");
  }
  if (Status vocabulary = CheckGgufVocabulary(*tokens, types); !vocabulary.ok()) {
    return error(vocabulary.message());
  }
  StatusOr<ByteLevelBpe> bpe = ByteLevelBpe::Create(*tokens, merges, ignore_merges);
  if (!bpe.ok()) return error(bpe.status().message());
  std::unique_ptr<Tokenizer> t =
      TokenizerLoader::Make(std::make_unique<ByteLevelBpeModel>(std::move(bpe).value(), *pre));
  if (types) {
    for (size_t i = 0; i < types->size(); ++i) {
      int64_t type = (*types)[i];
      if (type == kControl || type == kUserDefined) {
        TokenizerLoader::AddToken(t.get(), (*tokens)[i], static_cast<int32_t>(i), type == kControl);
      }
    }
  }
  int32_t bos = static_cast<int32_t>(gguf.GetInt("tokenizer.ggml.bos_token_id").value_or(-1));
  int32_t eos = static_cast<int32_t>(gguf.GetInt("tokenizer.ggml.eos_token_id").value_or(-1));
  bool add_bos =
      gguf.GetBool("tokenizer.ggml.add_bos_token").value_or(*pre == PreTokenizerType::kLlama3);
  bool add_eos = gguf.GetBool("tokenizer.ggml.add_eos_token").value_or(false);
  std::vector<int32_t> prefix, suffix;
  if (add_bos && bos >= 0) prefix.push_back(bos);
  if (add_eos && eos >= 0) suffix.push_back(eos);
  TokenizerLoader::SetSpecialIds(t.get(), bos, eos, std::move(prefix), std::move(suffix));
  if (std::optional<std::string> jinja = gguf.GetString("tokenizer.chat_template")) {
    TokenizerLoader::SetChatTemplate(t.get(), *jinja);
  }
  return t;
}

StatusOr<json> ReadJson(const std::string& path, bool required) {
  std::ifstream in(path);
  if (!in) {
    if (required) return Status::NotFound(path + ": cannot open");
    return json();
  }
  std::stringstream buf;
  buf << in.rdbuf();
  json j = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(path + ": not valid JSON");
  if (!j.is_object()) return JsonReader(path).WrongType("top level", "an object", j);
  return j;
}

std::string JsonString(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

StatusOr<std::string> TokenContent(const JsonReader& in, const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_object()) {
    return in.WrongType(key, "a string or an object with a \"content\" string", *it);
  }
  SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<std::string> content,
                             in.String(*it, "content", key));
  return content.value_or("");
}

StatusOr<std::vector<AddedTokenEntry>> ReadAddedTokens(const JsonReader& in, const json& tokenizer,
                                                       int64_t limit, std::string_view limit_name) {
  std::vector<AddedTokenEntry> out;
  SNAPSERVE_ASSIGN_OR_RETURN(const json* added, in.Array(tokenizer, "added_tokens", ""));
  if (added == nullptr) return out;
  for (size_t i = 0; i < added->size(); ++i) {
    const json& a = (*added)[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object()) return in.WrongType(field, "an object", a);
    const auto id = a.find("id");
    if (id == a.end()) return in.Error(field + ".id", "missing");
    SNAPSERVE_ASSIGN_OR_RETURN(const int32_t checked,
                               in.TokenId(*id, field + ".id", limit, limit_name));
    SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<std::string> content,
                               in.String(a, "content", field));
    if (!content) return in.Error(field + ".content", "missing");
    SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> special, in.Bool(a, "special", field));
    out.push_back({checked, *content, special.value_or(false)});
  }
  return out;
}

std::optional<int64_t> ModelVocabSize(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  const json config = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return std::nullopt;
  const auto it = config.find("vocab_size");
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
    return std::nullopt;
  return it->get<int64_t>();
}

namespace {

// The byte-level BPE runtime's bound on ids (its tables are indexed by id).
constexpr int64_t kMaxVocabulary = int64_t{1} << 24;

std::string Str(const json& j, const char* key) { return JsonString(j, key); }

// A tokenizer.json the byte-level BPE path handles; in a directory with a
// tokenizer.model anything else goes to SentencePiece.
bool IsByteLevelBpeJson(const json& tj) {
  const json& model = tj.value("model", json());
  const json& decoder = tj.value("decoder", json());
  return model.is_object() && Str(model, "type") == "BPE" && decoder.is_object() &&
         Str(decoder, "type") == "ByteLevel";
}

// `p` (at `where`) is ByteLevel without a prefix space, with use_regex as given.
StatusOr<bool> IsByteLevel(const JsonReader& in, const json& p, const std::string& where,
                           bool use_regex) {
  if (!p.is_object() || Str(p, "type") != "ByteLevel") return false;
  SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> prefix,
                             in.Bool(p, "add_prefix_space", where));
  SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> regex, in.Bool(p, "use_regex", where));
  return !prefix.value_or(false) && regex.value_or(true) == use_regex;
}

StatusOr<PreTokenizerType> DetectPreTokenizer(const JsonReader& in, const json& p) {
  SNAPSERVE_ASSIGN_OR_RETURN(const bool gpt2, IsByteLevel(in, p, "pre_tokenizer", true));
  if (gpt2) return PreTokenizerType::kGpt2;
  if (p.is_object() && Str(p, "type") == "Sequence") {
    SNAPSERVE_ASSIGN_OR_RETURN(const json* seq, in.Array(p, "pretokenizers", "pre_tokenizer"));
    if (seq != nullptr && seq->size() == 2) {
      const json& first = (*seq)[0];
      const std::string first_at = "pre_tokenizer.pretokenizers[0]";
      const std::string second_at = "pre_tokenizer.pretokenizers[1]";
      if (Str(first, "type") == "Digits") {
        SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> individual,
                                   in.Bool(first, "individual_digits", first_at));
        SNAPSERVE_ASSIGN_OR_RETURN(const bool byte_level,
                                   IsByteLevel(in, (*seq)[1], second_at, true));
        if (individual.value_or(false) && byte_level) return PreTokenizerType::kSmolLM;
      }
      if (Str(first, "type") == "Split") {
        SNAPSERVE_ASSIGN_OR_RETURN(const json* pattern, in.Object(first, "pattern", first_at));
        SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> invert,
                                   in.Bool(first, "invert", first_at));
        SNAPSERVE_ASSIGN_OR_RETURN(const bool byte_level,
                                   IsByteLevel(in, (*seq)[1], second_at, false));
        if (pattern != nullptr && Str(*pattern, "Regex") == kLlama3Pattern &&
            Str(first, "behavior") == "Isolated" && !invert.value_or(false) && byte_level) {
          return PreTokenizerType::kLlama3;
        }
      }
    }
  }
  return Status::Unimplemented("pre_tokenizer " + Bounded(p.dump()) + " is not supported");
}

// Collects the ids TemplateProcessing (at `where`) puts around a single
// sequence; each must be below `limit`, the tokenizer's vocabulary size.
Status TemplateIds(const JsonReader& in, const json& post, const std::string& where, int64_t limit,
                   std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (post.is_null()) return Status::Ok();
  if (!post.is_object()) return in.WrongType(where, "an object", post);
  if (Str(post, "type") == "Sequence") {
    SNAPSERVE_ASSIGN_OR_RETURN(const json* processors, in.Array(post, "processors", where));
    for (size_t i = 0; processors != nullptr && i < processors->size(); ++i) {
      SNAPSERVE_RETURN_IF_ERROR(TemplateIds(in, (*processors)[i],
                                            where + ".processors[" + std::to_string(i) + "]", limit,
                                            prefix, suffix));
    }
    return Status::Ok();
  }
  if (Str(post, "type") != "TemplateProcessing") return Status::Ok();
  SNAPSERVE_ASSIGN_OR_RETURN(const json* single, in.Array(post, "single", where));
  SNAPSERVE_ASSIGN_OR_RETURN(const json* specials, in.Object(post, "special_tokens", where));
  bool after = false;
  for (size_t i = 0; single != nullptr && i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string item_at = where + ".single[" + std::to_string(i) + "]";
    if (!item.is_object()) return in.WrongType(item_at, "an object", item);
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    SNAPSERVE_ASSIGN_OR_RETURN(const json* special, in.Object(item, "SpecialToken", item_at));
    if (special == nullptr) continue;
    const std::string name = Str(*special, "id");
    if (specials == nullptr || !specials->contains(name)) continue;
    const json& entry = specials->at(name);
    const std::string entry_at = where + ".special_tokens[\"" + Bounded(name, 64) + "\"]";
    if (!entry.is_object()) return in.WrongType(entry_at, "an object", entry);
    SNAPSERVE_ASSIGN_OR_RETURN(const json* ids, in.Array(entry, "ids", entry_at));
    for (size_t k = 0; ids != nullptr && k < ids->size(); ++k) {
      SNAPSERVE_ASSIGN_OR_RETURN(const int32_t id,
                                 in.TokenId((*ids)[k], entry_at + ".ids[" + std::to_string(k) + "]",
                                            limit, "the vocabulary size"));
      (after ? suffix : prefix)->push_back(id);
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> TokenizerLoader::FromHfDirectory(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  SNAPSERVE_ASSIGN_OR_RETURN(json tj, ReadJson(path, false));
  // Llama-2 / Mistral-7B-v0.1 directories: their tokenizer.json (if any) is
  // HF's conversion of tokenizer.model; the original runs instead.
  if ((tj.is_null() || !IsByteLevelBpeJson(tj)) &&
      std::filesystem::exists(dir + "/tokenizer.model")) {
    return FromSentencePieceDirectory(dir, tj);
  }
  if (tj.is_null()) {
    return Status::NotFound(path + ": cannot open (and there is no SentencePiece tokenizer.model)");
  }
  const JsonReader in(path);
  auto error = [&](const std::string& what) { return Status::InvalidArgument(path + ": " + what); };
  SNAPSERVE_ASSIGN_OR_RETURN(const json* model, in.Object(tj, "model", ""));
  if (model == nullptr || Str(*model, "type") != "BPE") {
    return Status::Unimplemented(path + ": only BPE models are supported");
  }
  if (tj.contains("normalizer") && !tj["normalizer"].is_null()) {
    return Status::Unimplemented(path + ": normalizers are not supported");
  }
  const json& decoder = tj.value("decoder", json());
  if (!decoder.is_object() || Str(decoder, "type") != "ByteLevel") {
    return Status::Unimplemented(path + ": only the ByteLevel decoder is supported");
  }
  StatusOr<PreTokenizerType> pre = DetectPreTokenizer(in, tj.value("pre_tokenizer", json()));
  if (!pre.ok() && pre.status().code() == StatusCode::kInvalidArgument) return pre.status();
  if (!pre.ok()) return Status(pre.status().code(), path + ": " + pre.status().message());

  // Ids come from the vocab map and from added_tokens (which may lie past
  // it). Every id must have a row in the model's embedding (config.json's
  // vocab_size, when the directory has one): a larger id would fail only
  // when a prompt first produces it.
  const std::optional<int64_t> model_vocab = ModelVocabSize(dir);
  const int64_t limit = model_vocab.value_or(kMaxVocabulary);
  const std::string limit_name =
      model_vocab ? "config.json's vocab_size" : "the largest supported vocabulary";
  SNAPSERVE_ASSIGN_OR_RETURN(const json* vocab, in.Object(*model, "vocab", "model"));
  if (vocab == nullptr) return in.Error("model.vocab", "missing");
  SNAPSERVE_ASSIGN_OR_RETURN(const std::vector<AddedTokenEntry> added,
                             ReadAddedTokens(in, tj, limit, limit_name));
  int64_t size = 0;
  std::vector<std::pair<int32_t, std::string>> entries;
  entries.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string field = "model.vocab[\"" + Bounded(it.key(), 64) + "\"]";
    SNAPSERVE_ASSIGN_OR_RETURN(const int32_t id, in.TokenId(*it, field, limit, limit_name));
    entries.emplace_back(id, it.key());
    size = std::max<int64_t>(size, id + 1);
  }
  for (const AddedTokenEntry& a : added) size = std::max<int64_t>(size, a.id + 1);
  if (size <= 0) return error("bad vocabulary size");
  std::vector<std::string> tokens(static_cast<size_t>(size));
  for (auto& [id, text] : entries) tokens[static_cast<size_t>(id)] = std::move(text);
  for (const AddedTokenEntry& a : added) {
    if (tokens[static_cast<size_t>(a.id)].empty()) tokens[static_cast<size_t>(a.id)] = a.content;
  }
  std::vector<std::pair<std::string, std::string>> merges;
  SNAPSERVE_ASSIGN_OR_RETURN(const json* merge_list, in.Array(*model, "merges", "model"));
  for (size_t i = 0; merge_list != nullptr && i < merge_list->size(); ++i) {
    const json& m = (*merge_list)[i];
    if (m.is_string()) {
      std::string line = m.get<std::string>();
      size_t space = line.find(' ', 1);
      if (space == std::string::npos) return error("bad merge '" + Bounded(line) + "'");
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return error("bad merge " + Bounded(m.dump()));
    }
  }
  SNAPSERVE_ASSIGN_OR_RETURN(const std::optional<bool> ignore_merges,
                             in.Bool(*model, "ignore_merges", "model"));
  StatusOr<ByteLevelBpe> bpe =
      ByteLevelBpe::Create(std::move(tokens), merges, ignore_merges.value_or(false));
  if (!bpe.ok()) return error(bpe.status().message());
  std::unique_ptr<Tokenizer> t =
      TokenizerLoader::Make(std::make_unique<ByteLevelBpeModel>(std::move(bpe).value(), *pre));
  for (const AddedTokenEntry& a : added) {
    TokenizerLoader::AddToken(t.get(), a.content, a.id, a.special);
  }

  const std::string config_path = dir + "/tokenizer_config.json";
  SNAPSERVE_ASSIGN_OR_RETURN(const json config, ReadJson(config_path, false));
  const JsonReader config_in(config_path);
  const json& cfg = config.is_object() ? config : json::object();
  int32_t bos = -1, eos = -1;
  SNAPSERVE_ASSIGN_OR_RETURN(const std::string bos_text, TokenContent(config_in, cfg, "bos_token"));
  SNAPSERVE_ASSIGN_OR_RETURN(const std::string eos_text, TokenContent(config_in, cfg, "eos_token"));
  if (!bos_text.empty()) bos = t->model_->Find(bos_text);
  if (!eos_text.empty()) eos = t->model_->Find(eos_text);
  std::vector<int32_t> prefix, suffix;
  SNAPSERVE_RETURN_IF_ERROR(TemplateIds(in, tj.value("post_processor", json()), "post_processor",
                                        t->vocab_size(), &prefix, &suffix));
  TokenizerLoader::SetSpecialIds(t.get(), bos, eos, std::move(prefix), std::move(suffix));

  SNAPSERVE_RETURN_IF_ERROR(
      TokenizerLoader::SetChatTemplateFromDirectory(t.get(), dir, config_in, cfg));
  return t;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfDirectory(const std::string& dir) {
  // Every field is read through JsonReader, which never throws; this is the
  // backstop for a path that reads JSON some other way: a malformed file must
  // fail the load with its directory named, never abort the server.
  try {
    return TokenizerLoader::FromHfDirectory(dir);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(dir + ": malformed tokenizer files: " + Bounded(e.what()));
  }
}

}  // namespace snapserve::tokenizer
