// GGUF reader (engine/model/gguf_file.h): header, metadata values (nested
// arrays included), tensor infos and the extent checks of gguf_extents.h,
// then the byte-level BPE tokenizer built from the metadata
// (Tokenizer::FromGguf). Any error Status is fine; a crash, an ASan/UBSan
// report or a leak is a finding. Seeds: the default model's header and
// tensor table (tests/fuzz/make_seeds.py).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using snapserve::fuzz::Check;
using snapserve::model::GgufArray;
using snapserve::model::GgufFile;
using snapserve::model::GgufTensorInfo;
using snapserve::model::GgufValue;

// Walks every value, as the loader's readers do.
size_t Visit(const GgufValue& v) {
  if (const auto* a = std::get_if<GgufArray>(&v)) {
    size_t n = a->items.size();
    for (const GgufValue& item : a->items) n += Visit(item);
    return n;
  }
  if (const auto* s = std::get_if<std::string>(&v)) return s->size();
  return 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static snapserve::fuzz::InputFile* input = new snapserve::fuzz::InputFile();
  input->Write(data, size);
  auto file = GgufFile::Open(input->Path());
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  volatile size_t sink = 0;
  for (const auto& [key, value] : f.metadata()) {
    sink = sink + Visit(value) + snapserve::model::ShownName(key).size();
    (void)f.GetString(key);
    (void)f.GetInt(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetStringArray(key);
    (void)f.GetIntArray(key);
    (void)f.GetFloatArray(key);
  }
  // A tensor the reader accepted lies inside the file: touching its first and
  // last byte must stay inside the (heap-backed, fuzz_support.cc) mapping.
  Check(f.data_offset() <= size || f.tensors().empty(), "data section starts past the file");
  for (const GgufTensorInfo& t : f.tensors()) {
    Check(f.FindTensor(t.name) == &t, "tensor index disagrees with the table");
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    sink = sink + snapserve::model::GgufTypeName(t.type).size();
  }
  auto tokenizer = snapserve::tokenizer::Tokenizer::FromGguf(f);
  if (tokenizer.ok()) {
    const auto& tok = **tokenizer;
    const std::vector<int32_t> ids = tok.Encode("Hello, world! 123 <|im_end|>", true);
    sink = sink + tok.Decode(ids).size();
    auto chat = tok.EncodeChat({{"user", "hi"}}, true);
    if (chat.ok()) sink = sink + chat->size();
  }
  return 0;
}
