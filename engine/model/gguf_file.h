// GGUF reader: mmaps a .gguf file read-only and exposes its metadata and its
// tensor table. It owns the mapping and nothing else: it never dequantizes
// (engine/model's loader does) and never copies tensor data.
//
// Every length read from the file (strings, arrays, counts, tensor extents) is
// checked against the file size before anything is allocated, so a corrupt or
// hostile file fails with a Status naming the file and the problem instead of
// crashing or asking for terabytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::model {

// ggml tensor type ids (ggml.h). Types not listed keep their raw number.
enum class GgufType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

// A key or tensor name from a file as error messages show it: its first 100
// bytes, printable ASCII kept and every other byte as \xNN (a corrupt name
// is often binary, and an error line must stay valid text), then
// "...(N bytes)" when it was longer.
std::string ShownName(std::string_view name);

// "F32", "Q4_1", ... or "unknown(<id>)" for an id ggml does not define.
std::string GgufTypeName(uint32_t type);

// Elements per block and bytes per block of a ggml type; nullopt if unknown.
struct GgufBlockSize {
  int64_t elements;
  int64_t bytes;
};
std::optional<GgufBlockSize> GgufTypeBlockSize(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the fastest-varying (ggml ne[0])
  uint32_t type;              // raw ggml type id; compare with GgufType
  uint64_t offset;            // relative to the data section
  const uint8_t* data;        // points into the mmap; valid while the GgufFile lives
  uint64_t nbytes;            // from type + dims (checked against the file); 0 for unknown types
};

// A metadata value. Signed integers are held as int64_t, unsigned as uint64_t,
// f32/f64 as double. Arrays may nest (GGUF allows arrays of arrays).
struct GgufValue;
struct GgufArray {
  uint32_t element_type;  // GGUF value type id of the elements
  std::vector<GgufValue> items;
};
struct GgufValue : std::variant<bool, int64_t, uint64_t, double, std::string, GgufArray> {
  using variant::variant;
};

class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

  bool has(std::string_view key) const;
  const GgufValue* Find(std::string_view key) const;
  std::optional<std::string> GetString(std::string_view key) const;
  std::optional<int64_t> GetInt(std::string_view key) const;   // any integer type
  std::optional<double> GetFloat(std::string_view key) const;  // f32/f64 (and integers)
  std::optional<bool> GetBool(std::string_view key) const;
  std::optional<std::vector<std::string>> GetStringArray(std::string_view key) const;
  std::optional<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  std::optional<std::vector<double>> GetFloatArray(std::string_view key) const;
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status Parse();

  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace snapserve::model
