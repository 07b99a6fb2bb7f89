// engine_start_error(path): what the server's start would say about a model
// file, in-process: Engine::Create (model and tokenizer) with a small KV
// cache, then Shutdown. "" when it starts. Lets pytest classify many mutated
// files in one process instead of paying a server start for each. Bytes
// outside ASCII come back as \xNN: a message may quote bytes of a corrupt
// file, and Python needs valid UTF-8.
#include <torch/library.h>

#include <string>

#include "engine/engine.h"

namespace {

std::string AsciiOnly(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x80) {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  return out;
}

std::string EngineStartError(const std::string& path) {
  snapserve::engine::EngineOptions options;
  options.model_path = path;
  options.kv_cache_memory_bytes = int64_t{16} << 20;
  auto engine = snapserve::engine::Engine::Create(options);
  if (!engine.ok()) return AsciiOnly(engine.status().ToString());
  (*engine)->Shutdown();
  return "";
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("engine_start_error(str path) -> str", &EngineStartError);
}
