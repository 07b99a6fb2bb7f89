// Hugging Face tokenizer loading (Tokenizer::FromHfDirectory,
// engine/tokenizer/tokenizer_loader.cc): tokenizer.json (model, vocab, merges,
// added_tokens, pre_tokenizer, decoder, post_processor) and
// tokenizer_config.json (bos/eos, chat_template), plus config.json's
// vocab_size, which bounds every id. A tokenizer that loads is then used
// (encode, decode, chat template). Any error Status is fine; a crash, an
// ASan/UBSan report, an exception (caught or not) or a leak is a finding.
//
// Input: tokenizer.json NUL tokenizer_config.json NUL config.json; a file
// whose part is missing is absent from the directory.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

using snapserve::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A static object: its destructor removes the directory when the fuzzer exits.
  static snapserve::fuzz::InputDirectory dir;
  const std::vector<std::string_view> parts = snapserve::fuzz::SplitOnNul(data, size, 3);
  const char* const kNames[] = {"tokenizer.json", "tokenizer_config.json", "config.json"};
  for (size_t i = 0; i < 3; ++i) dir.WriteFile(kNames[i], i < parts.size() ? &parts[i] : nullptr);

  auto loaded = snapserve::tokenizer::Tokenizer::FromHfDirectory(dir.Path());
  if (!loaded.ok()) {
    // FromHfDirectory turns a JSON exception into an error as a backstop, but
    // every field is meant to be read through JsonReader, which never throws
    // (tokenizer_loader.cc): reaching the backstop is a finding too.
    // Matched as the backstop's whole prefix: other errors may quote the
    // input, and the input may contain these words (a corpus entry does).
    const std::string backstop = dir.Path() + ": malformed tokenizer files: ";
    Check(loaded.status().message().rfind(backstop, 0) != 0,
          "a JSON exception reached FromHfDirectory's backstop");
    return 0;
  }
  const auto& tok = **loaded;
  Check(tok.vocab_size() > 0, "a loaded tokenizer has no vocabulary");
  volatile size_t sink = 0;
  const std::vector<int32_t> ids =
      tok.Encode("Hello, world! 123 <|im_end|> \xe4\xbd\xa0\xff", true);
  for (int32_t id : ids) Check(id >= 0 && id < tok.vocab_size(), "id out of the vocabulary");
  sink = sink + tok.Decode(ids).size() + tok.Decode(ids, true).size();
  auto chat = tok.EncodeChat({{"system", "s"}, {"user", "hi"}, {"assistant", "yo"}}, true);
  if (chat.ok()) {
    for (int32_t id : *chat) Check(id >= 0 && id < tok.vocab_size(), "id out of the vocabulary");
  }
  for (int32_t id = 0; id < tok.vocab_size() && id < 512; ++id) {
    sink = sink + tok.TokenBytes(id).size() + tok.TokenText(id).size();
  }
  return 0;
}
