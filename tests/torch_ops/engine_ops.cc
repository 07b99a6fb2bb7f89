// engine_start_error(path): what the server's start would say about a model
// file, in-process: Engine::Create (model and tokenizer) with a small KV
// cache, then Shutdown. "" when it starts. Lets pytest classify many mutated
// files in one process instead of paying a server start for each.
#include <torch/library.h>

#include <string>

#include "engine/engine.h"

namespace {

std::string EngineStartError(const std::string& path) {
  snapserve::engine::EngineOptions options;
  options.model_path = path;
  options.kv_cache_memory_bytes = int64_t{16} << 20;
  auto engine = snapserve::engine::Engine::Create(options);
  if (!engine.ok()) return engine.status().ToString();
  (*engine)->Shutdown();
  return "";
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("engine_start_error(str path) -> str", &EngineStartError);
}
