#include "engine/model/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "engine/model/gguf_extents.h"

namespace snapserve::model {
namespace {

// GGUF metadata value types (gguf.h).
enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// GGML_MAX_NAME is 64 bytes with the terminating NUL; llama.cpp refuses longer.
constexpr size_t kMaxTensorName = 63;
constexpr int kMaxArrayNesting = 8;  // guards the recursion on nested arrays
constexpr uint64_t kMaxAlignment = 1 << 20;
// Real vocabularies and merge lists hold at most a few million entries; a
// larger claim is refused so that a file of junk cannot make us allocate
// tens of bytes per byte of file.
constexpr uint64_t kMaxArrayCount = uint64_t{1} << 24;

// Smallest encoded size of one value of `type`: used to reject counts that
// could not possibly fit in the bytes left, before reserving anything.
uint64_t MinEncodedSize(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
    case kString:  // a string is at least its 8-byte length prefix
      return 8;
    case kArray:
      return 4 + 8;  // element type + count
    default:
      return 0;
  }
}

// Bounds-checked little-endian reader over the mapping. Every read states what
// it is reading so that an error names the field that ran off the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  template <typename T>
  bool Read(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));  // x86/ARM little-endian, like GGUF
    pos_ += sizeof(T);
    return true;
  }
  bool ReadString(std::string* out) {
    uint64_t len;
    if (!Read(&len) || len > left()) return false;
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return true;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

class Parser {
 public:
  Parser(const std::string& path, Cursor* cur) : path_(path), cur_(cur) {}

  Status Error(const std::string& what) const {
    return Status::InvalidArgument(path_ + ": " + what);
  }
  Status Truncated(const std::string& what) const {
    return Error(what + " extends past end of file (offset " + std::to_string(cur_->pos()) + ")");
  }

  Status ReadValue(uint32_t type, const std::string& key, int depth, GgufValue* out) {
    switch (type) {
      case kU8:
        return ReadInt<uint8_t>(key, out);
      case kI8:
        return ReadInt<int8_t>(key, out);
      case kU16:
        return ReadInt<uint16_t>(key, out);
      case kI16:
        return ReadInt<int16_t>(key, out);
      case kU32:
        return ReadInt<uint32_t>(key, out);
      case kI32:
        return ReadInt<int32_t>(key, out);
      case kU64:
        return ReadInt<uint64_t>(key, out);
      case kI64:
        return ReadInt<int64_t>(key, out);
      case kF32: {
        float v;
        if (!cur_->Read(&v)) return Truncated("value of '" + ShownName(key) + "'");
        *out = static_cast<double>(v);
        return Status::Ok();
      }
      case kF64: {
        double v;
        if (!cur_->Read(&v)) return Truncated("value of '" + ShownName(key) + "'");
        *out = v;
        return Status::Ok();
      }
      case kBool: {
        uint8_t v;
        if (!cur_->Read(&v)) return Truncated("value of '" + ShownName(key) + "'");
        if (v > 1) return Error("bool '" + ShownName(key) + "' has value " + std::to_string(v));
        *out = v != 0;
        return Status::Ok();
      }
      case kString: {
        std::string s;
        if (!cur_->ReadString(&s)) return Truncated("string '" + ShownName(key) + "'");
        *out = std::move(s);
        return Status::Ok();
      }
      case kArray:
        return ReadArray(key, depth, out);
      default:
        return Error("metadata '" + ShownName(key) + "' has unknown value type " +
                     std::to_string(type));
    }
  }

 private:
  template <typename T>
  Status ReadInt(const std::string& key, GgufValue* out) {
    T v;
    if (!cur_->Read(&v)) return Truncated("value of '" + ShownName(key) + "'");
    if constexpr (std::is_signed_v<T>) {
      *out = static_cast<int64_t>(v);
    } else {
      *out = static_cast<uint64_t>(v);
    }
    return Status::Ok();
  }

  Status ReadArray(const std::string& key, int depth, GgufValue* out) {
    if (depth >= kMaxArrayNesting) return Error("array '" + ShownName(key) + "' nested too deeply");
    uint32_t elem_type;
    uint64_t count;
    if (!cur_->Read(&elem_type) || !cur_->Read(&count))
      return Truncated("array '" + ShownName(key) + "'");
    uint64_t min_size = MinEncodedSize(elem_type);
    if (min_size == 0) {
      return Error("array '" + ShownName(key) + "' has unknown element type " +
                   std::to_string(elem_type));
    }
    if (count > cur_->left() / min_size || count > kMaxArrayCount) {
      return Error("array '" + ShownName(key) + "' claims " + std::to_string(count) +
                   " elements, which do not fit in the file");
    }
    GgufArray array;
    array.element_type = elem_type;
    array.items.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      GgufValue item;
      SNAPSERVE_RETURN_IF_ERROR(ReadValue(elem_type, key, depth + 1, &item));
      array.items.push_back(std::move(item));
    }
    *out = std::move(array);
    return Status::Ok();
  }

  const std::string& path_;
  Cursor* cur_;
};

std::optional<int64_t> AsInt(const GgufValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(*u);
    }
  }
  return std::nullopt;
}

std::optional<double> AsFloat(const GgufValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  return std::nullopt;
}

}  // namespace

namespace {

// Block layouts from ggml's type traits (mirrored by gguf-py GGML_QUANT_SIZES).
struct TypeTraits {
  uint32_t id;
  const char* name;
  int64_t block_elements;
  int64_t block_bytes;
};
constexpr TypeTraits kTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

const TypeTraits* FindType(uint32_t type) {
  for (const TypeTraits& t : kTypes) {
    if (t.id == type) return &t;
  }
  return nullptr;
}

}  // namespace

std::string ShownName(std::string_view name) {
  constexpr size_t kMaxShown = 100;
  std::string out;
  for (char c : name.substr(0, kMaxShown)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  if (name.size() > kMaxShown) out += "...(" + std::to_string(name.size()) + " bytes)";
  return out;
}

std::string GgufTypeName(uint32_t type) {
  const TypeTraits* t = FindType(type);
  return t != nullptr ? t->name : "unknown(" + std::to_string(type) + ")";
}

std::optional<GgufBlockSize> GgufTypeBlockSize(uint32_t type) {
  const TypeTraits* t = FindType(type);
  if (t == nullptr) return std::nullopt;
  return GgufBlockSize{t->block_elements, t->block_bytes};
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": not a regular file");
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* m = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::Internal(path + ": mmap failed: " + std::strerror(err));
    }
    file->map_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file alive
  SNAPSERVE_RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

Status GgufFile::Parse() {
  Cursor cur(map_, size_);
  Parser parser(path_, &cur);
  char magic[4];
  if (!cur.Read(&magic)) return parser.Error("too small to be a GGUF file");
  if (std::memcmp(magic, "GGUF", 4) != 0) return parser.Error("bad magic (not a GGUF file)");
  if (!cur.Read(&version_)) return parser.Truncated("header");
  if (version_ != 2 && version_ != 3) {
    return parser.Error("unsupported GGUF version " + std::to_string(version_) +
                        " (supported: 2, 3)");
  }
  uint64_t tensor_count, kv_count;
  if (!cur.Read(&tensor_count) || !cur.Read(&kv_count)) return parser.Truncated("header");
  // Smallest possible entries: a kv is key length + type + 1 byte; a tensor
  // info is name length + n_dims + type + offset.
  if (kv_count > cur.left() / (8 + 4 + 1)) {
    return parser.Error("metadata count " + std::to_string(kv_count) + " does not fit in the file");
  }
  if (tensor_count > cur.left() / (8 + 4 + 4 + 8)) {
    return parser.Error("tensor count " + std::to_string(tensor_count) +
                        " does not fit in the file");
  }

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    if (!cur.ReadString(&key)) {
      return parser.Truncated("key of metadata entry " + std::to_string(i));
    }
    uint32_t type;
    if (!cur.Read(&type)) return parser.Truncated("type of '" + ShownName(key) + "'");
    GgufValue value;
    SNAPSERVE_RETURN_IF_ERROR(parser.ReadValue(type, key, 0, &value));
    if (!metadata_.emplace(std::move(key), std::move(value)).second) {
      return parser.Error("duplicate metadata key");
    }
  }
  if (const GgufValue* a = Find("general.alignment")) {
    std::optional<int64_t> v = AsInt(*a);
    if (!v || *v <= 0 || *v > static_cast<int64_t>(kMaxAlignment) || (*v & (*v - 1)) != 0) {
      return parser.Error("general.alignment must be a power of two up to 1 MiB");
    }
    alignment_ = static_cast<uint64_t>(*v);
  }

  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    if (!cur.ReadString(&t.name)) return parser.Truncated("name of tensor " + std::to_string(i));
    if (t.name.size() > kMaxTensorName) {
      // Most often the sign of a corrupt tensor table: a length read from
      // the middle of another field.
      return parser.Error("tensor " + std::to_string(i) + "'s name '" + ShownName(t.name) +
                          "' is " + std::to_string(t.name.size()) + " bytes long (ggml allows " +
                          std::to_string(kMaxTensorName) + ")");
    }
    const std::string label = "tensor '" + ShownName(t.name) + "'";
    uint32_t n_dims;
    if (!cur.Read(&n_dims)) return parser.Truncated(label);
    if (n_dims > kMaxDims) {
      return parser.Error(label + " has " + std::to_string(n_dims) + " dimensions (max 4)");
    }
    bool absurd_dim = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim;
      if (!cur.Read(&dim)) return parser.Truncated(label);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) absurd_dim = true;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    if (!cur.Read(&t.type) || !cur.Read(&t.offset)) return parser.Truncated(label);
    if (absurd_dim) return parser.Error(label + " has an absurd shape");
    if (t.offset % alignment_ != 0) {
      return parser.Error(label + " offset " + std::to_string(t.offset) + " is not aligned to " +
                          std::to_string(alignment_));
    }
    t.nbytes = 0;  // unknown types: size unknown; the loader refuses them
    if (std::optional<GgufBlockSize> bs = GgufTypeBlockSize(t.type)) {
      std::string why;
      std::optional<uint64_t> nbytes = TensorByteSize(t.dims, bs->elements, bs->bytes, &why);
      if (!nbytes) return parser.Error(label + " of type " + GgufTypeName(t.type) + " " + why);
      t.nbytes = *nbytes;
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      return parser.Error("duplicate " + label);
    }
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t end_of_infos = cur.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  if (tensor_count > 0 && data_offset_ > size_) {
    return parser.Error("data section starts past end of file");
  }
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  std::vector<TensorExtent> extents;
  bool all_sizes_known = true;
  for (const GgufTensorInfo& t : tensors_) {
    if (GgufTypeBlockSize(t.type)) {
      extents.push_back({t.name, t.offset, t.nbytes});
    } else {
      all_sizes_known = false;
    }
  }
  if (Status s = CheckTensorExtents(std::move(extents), data_size, alignment_, all_sizes_known);
      !s.ok()) {
    return parser.Error(s.message());
  }
  for (GgufTensorInfo& t : tensors_) {
    // Unknown types have no checked extent: point at the section's start
    // rather than at an offset that may lie past the mapping.
    t.data = map_ + data_offset_ + (GgufTypeBlockSize(t.type) ? t.offset : 0);
  }
  return Status::Ok();
}

bool GgufFile::has(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  return std::nullopt;
}

std::optional<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? std::nullopt : AsInt(*v);
}

std::optional<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? std::nullopt : AsFloat(*v);
}

std::optional<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* b = std::get_if<bool>(v)) return *b;
  return std::nullopt;
}

std::optional<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  const auto* a = v == nullptr ? nullptr : std::get_if<GgufArray>(v);
  if (a == nullptr || a->element_type != kString) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const GgufValue& item : a->items) out.push_back(std::get<std::string>(item));
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  const auto* a = v == nullptr ? nullptr : std::get_if<GgufArray>(v);
  if (a == nullptr) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(a->items.size());
  for (const GgufValue& item : a->items) {
    std::optional<int64_t> i = AsInt(item);
    if (!i) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

std::optional<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  const auto* a = v == nullptr ? nullptr : std::get_if<GgufArray>(v);
  if (a == nullptr) return std::nullopt;
  std::vector<double> out;
  out.reserve(a->items.size());
  for (const GgufValue& item : a->items) {
    std::optional<double> d = AsFloat(item);
    if (!d) return std::nullopt;
    out.push_back(*d);
  }
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace snapserve::model
