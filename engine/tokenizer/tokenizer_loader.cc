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

namespace snapserve::tokenizer {

using json = nlohmann::json;

// The Llama-3 split regex exactly as tokenizer.json spells it.
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// llama.cpp's token types (tokenizer.ggml.token_type).
enum GgufTokenType : int64_t { kNormal = 1, kControl = 3, kUserDefined = 4 };

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

void TokenizerLoader::SetChatTemplateFromDirectory(Tokenizer* t, const std::string& dir,
                                                   const json& cfg) {
  std::string jinja;
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    jinja = cfg["chat_template"].get<std::string>();
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    for (const json& named : cfg["chat_template"]) {
      if (JsonString(named, "name") == "default") jinja = JsonString(named, "template");
    }
  } else if (std::ifstream in(dir + "/chat_template.jinja"); in) {
    std::stringstream buf;
    buf << in.rdbuf();
    jinja = buf.str();
  }
  if (!jinja.empty()) SetChatTemplate(t, jinja);
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
  return j;
}

std::string JsonString(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string TokenContent(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return JsonString(*it, "content");
  return "";
}

namespace {

std::string Str(const json& j, const char* key) { return JsonString(j, key); }

// A tokenizer.json the byte-level BPE path handles; in a directory with a
// tokenizer.model anything else goes to SentencePiece.
bool IsByteLevelBpeJson(const json& tj) {
  const json& model = tj.value("model", json());
  const json& decoder = tj.value("decoder", json());
  return model.is_object() && Str(model, "type") == "BPE" && decoder.is_object() &&
         Str(decoder, "type") == "ByteLevel";
}

bool IsByteLevel(const json& p, bool use_regex) {
  return p.is_object() && Str(p, "type") == "ByteLevel" && !p.value("add_prefix_space", false) &&
         p.value("use_regex", true) == use_regex;
}

StatusOr<PreTokenizerType> DetectPreTokenizer(const json& p) {
  if (IsByteLevel(p, true)) return PreTokenizerType::kGpt2;
  if (p.is_object() && Str(p, "type") == "Sequence" && p.contains("pretokenizers")) {
    const json& seq = p["pretokenizers"];
    if (seq.size() == 2 && Str(seq[0], "type") == "Digits" &&
        seq[0].value("individual_digits", false) && IsByteLevel(seq[1], true)) {
      return PreTokenizerType::kSmolLM;
    }
    if (seq.size() == 2 && Str(seq[0], "type") == "Split" && IsByteLevel(seq[1], false) &&
        seq[0].contains("pattern") && Str(seq[0]["pattern"], "Regex") == kLlama3Pattern &&
        Str(seq[0], "behavior") == "Isolated" && !seq[0].value("invert", false)) {
      return PreTokenizerType::kLlama3;
    }
  }
  return Status::Unimplemented("pre_tokenizer " + Bounded(p.dump()) + " is not supported");
}

// Collects the ids TemplateProcessing puts around a single sequence.
void TemplateIds(const json& post, std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (!post.is_object()) return;
  if (Str(post, "type") == "Sequence" && post.contains("processors")) {
    for (const json& p : post["processors"]) TemplateIds(p, prefix, suffix);
    return;
  }
  if (Str(post, "type") != "TemplateProcessing" || !post.contains("single")) return;
  bool after = false;
  for (const json& item : post["single"]) {
    if (item.contains("Sequence")) {
      after = true;
    } else if (item.contains("SpecialToken")) {
      std::string name = Str(item["SpecialToken"], "id");
      const json& specials = post.value("special_tokens", json::object());
      if (!specials.contains(name)) continue;
      for (const json& id : specials[name].value("ids", json::array())) {
        (after ? suffix : prefix)->push_back(id.get<int32_t>());
      }
    }
  }
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfDirectory(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  SNAPSERVE_ASSIGN_OR_RETURN(json tj, ReadJson(path, false));
  // Llama-2 / Mistral-7B-v0.1 directories: their tokenizer.json (if any) is
  // HF's conversion of tokenizer.model; the original runs instead.
  if ((tj.is_null() || !IsByteLevelBpeJson(tj)) &&
      std::filesystem::exists(dir + "/tokenizer.model")) {
    return TokenizerLoader::FromSentencePieceDirectory(dir, tj);
  }
  if (tj.is_null()) {
    return Status::NotFound(path + ": cannot open (and there is no SentencePiece tokenizer.model)");
  }
  auto error = [&](const std::string& what) { return Status::InvalidArgument(path + ": " + what); };
  const json& model = tj["model"];
  if (!model.is_object() || Str(model, "type") != "BPE") {
    return Status::Unimplemented(path + ": only BPE models are supported");
  }
  if (tj.contains("normalizer") && !tj["normalizer"].is_null()) {
    return Status::Unimplemented(path + ": normalizers are not supported");
  }
  const json& decoder = tj.value("decoder", json());
  if (!decoder.is_object() || Str(decoder, "type") != "ByteLevel") {
    return Status::Unimplemented(path + ": only the ByteLevel decoder is supported");
  }
  StatusOr<PreTokenizerType> pre = DetectPreTokenizer(tj.value("pre_tokenizer", json()));
  if (!pre.ok()) return Status(pre.status().code(), path + ": " + pre.status().message());

  // Ids come from the vocab map and from added_tokens (which may lie past it).
  const json& vocab = model.value("vocab", json::object());
  const json& added = tj.value("added_tokens", json::array());
  int64_t size = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    size = std::max(size, it->get<int64_t>() + 1);
  }
  for (const json& a : added) size = std::max(size, a.value("id", int64_t{-1}) + 1);
  if (size <= 0 || size > (int64_t{1} << 24)) return error("bad vocabulary size");
  std::vector<std::string> tokens(static_cast<size_t>(size));
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int64_t id = it->get<int64_t>();
    if (id < 0) return error("negative token id");
    tokens[static_cast<size_t>(id)] = it.key();
  }
  for (const json& a : added) {
    int64_t id = a.value("id", int64_t{-1});
    if (id >= 0 && tokens[static_cast<size_t>(id)].empty()) {
      tokens[static_cast<size_t>(id)] = Str(a, "content");
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& m : model.value("merges", json::array())) {
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
  StatusOr<ByteLevelBpe> bpe =
      ByteLevelBpe::Create(std::move(tokens), merges, model.value("ignore_merges", false));
  if (!bpe.ok()) return error(bpe.status().message());
  std::unique_ptr<Tokenizer> t =
      TokenizerLoader::Make(std::make_unique<ByteLevelBpeModel>(std::move(bpe).value(), *pre));
  for (const json& a : added) {
    TokenizerLoader::AddToken(t.get(), Str(a, "content"), a.value("id", -1),
                              a.value("special", false));
  }

  SNAPSERVE_ASSIGN_OR_RETURN(const json config, ReadJson(dir + "/tokenizer_config.json", false));
  const json& cfg = config.is_object() ? config : json::object();
  int32_t bos = -1, eos = -1;
  if (std::string s = TokenContent(cfg, "bos_token"); !s.empty()) bos = t->model_->Find(s);
  if (std::string s = TokenContent(cfg, "eos_token"); !s.empty()) eos = t->model_->Find(s);
  std::vector<int32_t> prefix, suffix;
  TemplateIds(tj.value("post_processor", json()), &prefix, &suffix);
  TokenizerLoader::SetSpecialIds(t.get(), bos, eos, std::move(prefix), std::move(suffix));

  TokenizerLoader::SetChatTemplateFromDirectory(t.get(), dir, cfg);
  return t;
}

}  // namespace snapserve::tokenizer
