#include "tests/fuzz/reference_tokenizer.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "engine/model/gguf_file.h"
#include "tests/fuzz/fuzz_support.h"

namespace snapserve::fuzz {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::unique_ptr<tokenizer::Tokenizer> Load(const std::string& source) {
  StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t = Status::NotFound("");
  if (IsDirectory(source)) {
    t = tokenizer::Tokenizer::FromHfDirectory(source);
  } else if (source.size() > 5 && source.substr(source.size() - 5) == ".gguf") {
    auto file = model::GgufFile::Open(source);
    t = file.ok() ? tokenizer::Tokenizer::FromGguf(**file)
                  : StatusOr<std::unique_ptr<tokenizer::Tokenizer>>(file.status());
  } else {
    // A tokenizer_files seed: tokenizer.json NUL tokenizer_config.json.
    std::ifstream in(source, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string seed = buf.str();
    static InputDirectory dir;  // removed at exit by its destructor
    const auto parts = SplitOnNul(reinterpret_cast<const uint8_t*>(seed.data()), seed.size(), 2);
    dir.WriteFile("tokenizer.json", &parts[0]);
    if (parts.size() > 1) dir.WriteFile("tokenizer_config.json", &parts[1]);
    t = tokenizer::Tokenizer::FromHfDirectory(dir.Path());
  }
  if (!t.ok()) {
    std::fprintf(stderr, "reference tokenizer %s: %s\n", source.c_str(),
                 t.status().ToString().c_str());
    std::abort();
  }
  std::fprintf(stderr, "reference tokenizer: %s (%d tokens)\n", source.c_str(), (*t)->vocab_size());
  return std::move(t).value();
}

}  // namespace

const tokenizer::Tokenizer& ReferenceTokenizer() {
  static const tokenizer::Tokenizer* const kTokenizer = [] {
    const char* env = std::getenv("SNAPSERVE_FUZZ_TOKENIZER");
    std::string source;
    if (env != nullptr && *env != '\0') {
      source = env;
    } else if (Exists(SNAPSERVE_FUZZ_DEFAULT_GGUF)) {
      source = SNAPSERVE_FUZZ_DEFAULT_GGUF;
    } else {
      source = SNAPSERVE_FUZZ_FALLBACK_TOKENIZER;
    }
    return Load(source).release();
  }();
  return *kTokenizer;
}

}  // namespace snapserve::fuzz
