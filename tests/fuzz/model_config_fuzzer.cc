// config.json parsing (engine/model/model_config.h, ParseHfConfig): every
// field, both rope spellings, then Validate and DebugString on what parsed.
// Any error Status is fine; a crash, an ASan/UBSan report (e.g. a float to
// integer conversion out of range), an uncaught exception or a leak is a
// finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/model/model_config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = snapserve::model::ParseHfConfig(text, "config.json");
  if (!config.ok()) return 0;
  snapserve::fuzz::Check(config->Validate("config.json").ok(),
                         "ParseHfConfig returned a config that fails Validate");
  volatile size_t sink = config->DebugString().size();
  (void)sink;
  return 0;
}
