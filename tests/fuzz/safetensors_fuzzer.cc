// Safetensors header parser (engine/model/safetensors.h): the 8-byte length,
// the JSON header, dtypes, shapes and data offsets. Any error Status is fine;
// a crash, an ASan/UBSan report, an uncaught exception or a leak is a finding.
#include <cstddef>
#include <cstdint>

#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static snapserve::fuzz::InputFile* input = new snapserve::fuzz::InputFile();
  input->Write(data, size);
  auto file = snapserve::model::SafetensorsFile::Open(input->Path());
  if (!file.ok()) return 0;
  volatile size_t sink = 0;
  for (const auto& t : (*file)->tensors()) {
    snapserve::fuzz::Check((*file)->Find(t.name) == &t, "tensor index disagrees with the table");
    // Inside the heap-backed mapping (fuzz_support.cc): ASan checks the bounds.
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    sink = sink + snapserve::model::SafetensorsDtypeName(t.dtype)[0];
  }
  return 0;
}
