// Safetensors reader: mmaps one .safetensors file read-only and exposes its
// tensor table (name, dtype, shape, bytes). Format: an 8-byte little-endian
// header length, a JSON header, then the raw data. It owns the mapping and
// nothing else; it never converts or copies tensor data (weights.cc does).
//
// Every offset and size is checked against the file before it is trusted, and
// a header length above kMaxHeaderBytes is rejected before anything is
// allocated, so a corrupt file fails with a Status naming file and tensor.
// As in the reference implementation, the tensors must tile the data section
// exactly: overlapping tensors and bytes that belong to no tensor are refused.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::model {

enum class SafetensorsDtype { kF32, kF16, kBF16 };

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;  // row-major, outermost first (as PyTorch)
  const uint8_t* data;         // into the mmap; valid while the file lives
  uint64_t nbytes;
};

class SafetensorsFile {
 public:
  // The same limit as the reference implementation (safetensors' MAX_HEADER_SIZE).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

const char* SafetensorsDtypeName(SafetensorsDtype dtype);

}  // namespace snapserve::model
