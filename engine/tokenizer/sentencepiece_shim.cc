// libsnapserve_sentencepiece.so: the C interface of sentencepiece_shim.h over
// sentencepiece::SentencePieceProcessor. Built as its own module and loaded
// with dlopen by sentencepiece_model.cc; see the header for why. Not part of
// snapserve_engine (no LibTorch, no protobuf besides the library's own).
#include "engine/tokenizer/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

sentencepiece::SentencePieceProcessor* Sp(void* handle) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(handle);
}

void CopyMessage(const std::string& message, char* err, size_t err_cap) {
  if (err == nullptr || err_cap == 0) return;
  const size_t n = std::min(message.size(), err_cap - 1);
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* snapserve_spm_load(const char* data, size_t size,
                                                                char* err, size_t err_cap) {
  try {
    auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto status = sp->LoadFromSerializedProto(std::string_view(data, size));
    if (!status.ok()) {
      CopyMessage(status.ToString(), err, err_cap);
      return nullptr;
    }
    return sp.release();
  } catch (const std::exception& e) {
    CopyMessage(e.what(), err, err_cap);
    return nullptr;
  }
}

__attribute__((visibility("default"))) void snapserve_spm_free(void* handle) { delete Sp(handle); }

__attribute__((visibility("default"))) int snapserve_spm_size(void* handle) {
  return Sp(handle)->GetPieceSize();
}

__attribute__((visibility("default"))) size_t snapserve_spm_piece(void* handle, int id, char* out,
                                                                  size_t cap) {
  const std::string& piece = Sp(handle)->IdToPiece(id);
  // A length-delimited copy, not a C string: pieces may hold any byte.
  std::memcpy(out, piece.data(),  // NOLINT(bugprone-not-null-terminated-result)
              std::min(piece.size(), cap));
  return piece.size();
}

__attribute__((visibility("default"))) int snapserve_spm_flags(void* handle, int id) {
  const auto* sp = Sp(handle);
  return (sp->IsControl(id) ? 1 : 0) | (sp->IsUnknown(id) ? 2 : 0) | (sp->IsByte(id) ? 4 : 0);
}

__attribute__((visibility("default"))) int snapserve_spm_piece_to_id(void* handle,
                                                                     const char* piece,
                                                                     size_t len) {
  return Sp(handle)->PieceToId(std::string_view(piece, len));
}

__attribute__((visibility("default"))) int snapserve_spm_bos_id(void* handle) {
  return Sp(handle)->bos_id();
}

__attribute__((visibility("default"))) int snapserve_spm_eos_id(void* handle) {
  return Sp(handle)->eos_id();
}

__attribute__((visibility("default"))) int64_t snapserve_spm_encode(void* handle, const char* text,
                                                                    size_t len, int* out,
                                                                    size_t cap) {
  try {
    std::vector<int> ids;
    if (!Sp(handle)->Encode(std::string_view(text, len), &ids).ok()) return -1;
    std::copy_n(ids.begin(), std::min(ids.size(), cap), out);
    return static_cast<int64_t>(ids.size());
  } catch (const std::exception&) {
    return -1;
  }
}

}  // extern "C"
