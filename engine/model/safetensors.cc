#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "engine/common/bounded_text.h"

namespace snapserve::model {
namespace {

bool DtypeFromString(const std::string& s, SafetensorsDtype* out, uint64_t* elem_bytes) {
  if (s == "F32") {
    *out = SafetensorsDtype::kF32;
    *elem_bytes = 4;
  } else if (s == "F16") {
    *out = SafetensorsDtype::kF16;
    *elem_bytes = 2;
  } else if (s == "BF16") {
    *out = SafetensorsDtype::kBF16;
    *elem_bytes = 2;
  } else {
    return false;
  }
  return true;
}

std::string Named(const std::string& name) { return "tensor `" + Bounded(name) + "`"; }

std::string Range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// The reference implementation's rule (safetensors' Metadata::validate and
// deserialize): sorted by (begin, end), each tensor starts where the one
// before it ends, the first at 0, and the last ends the file. So no two
// tensors share a byte (else one tensor's weights would silently be another's)
// and no byte belongs to none (the format forbids holes, which would let a
// file be two formats at once). Header order is free; empty tensors may sit
// at any boundary.
std::string UntiledTensors(std::vector<const SafetensorsTensor*> order, const uint8_t* data,
                           uint64_t data_size) {
  auto begin = [&](const SafetensorsTensor* t) { return static_cast<uint64_t>(t->data - data); };
  auto end = [&](const SafetensorsTensor* t) { return begin(t) + t->nbytes; };
  std::sort(order.begin(), order.end(),
            [&](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              return std::make_pair(begin(a), end(a)) < std::make_pair(begin(b), end(b));
            });
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors so far
  for (size_t i = 0; i < order.size(); ++i) {
    const SafetensorsTensor* t = order[i];
    if (begin(t) < covered) {
      const SafetensorsTensor* prev = order[i - 1];
      return Named(prev->name) + " (bytes " + Range(begin(prev), end(prev)) + ") overlaps " +
             Named(t->name) + " (bytes " + Range(begin(t), end(t)) + ")";
    }
    if (begin(t) > covered) {
      return "bytes " + Range(covered, begin(t)) + " of the data section belong to no tensor (" +
             (i == 0 ? "the first tensor, " + Named(t->name) + ", must start at 0"
                     : "between " + Named(order[i - 1]->name) + " and " + Named(t->name)) +
             ")";
    }
    covered = end(t);
  }
  if (covered < data_size) {
    return "bytes " + Range(covered, data_size) + " of the data section belong to no tensor (" +
           (order.empty() ? std::string("the header lists none")
                          : "after the last, " + Named(order.back()->name)) +
           ")";
  }
  return "";
}

}  // namespace

const char* SafetensorsDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
  }
  return "?";
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::Internal(path + ": fstat failed: " + std::strerror(errno));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* m = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return Status::Internal(path + ": mmap failed: " + std::strerror(errno));
    }
    file->map_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file alive
  SNAPSERVE_RETURN_IF_ERROR(file->Parse());
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::Parse() {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(path_ + ": not a valid safetensors file: " + what);
  };
  if (size_ < 8) return bad("shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map_[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    return bad("header length " + std::to_string(header_len) + " exceeds the " +
               std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (header_len > size_ - 8) {
    return bad("header length " + std::to_string(header_len) + " runs past the end of the " +
               std::to_string(size_) + "-byte file (truncated?)");
  }
  const char* header = reinterpret_cast<const char*>(map_ + 8);
  nlohmann::json j = nlohmann::json::parse(header, header + header_len, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("header is not a JSON object");

  const uint8_t* data = map_ + 8 + header_len;
  const uint64_t data_size = size_ - 8 - header_len;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const auto& e = it.value();
    // Names and dtypes are echoed bounded: a header may hold megabyte-long keys.
    auto tensor_bad = [&](const std::string& what) {
      return Status::InvalidArgument(path_ + ": tensor `" + Bounded(name) + "`: " + what);
    };
    if (!e.is_object()) return tensor_bad("entry is not an object");
    auto dt = e.find("dtype");
    auto shape = e.find("shape");
    auto offsets = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string() || shape == e.end() || !shape->is_array() ||
        offsets == e.end() || !offsets->is_array() || offsets->size() != 2) {
      return tensor_bad("needs string `dtype`, array `shape`, two `data_offsets`");
    }
    SafetensorsTensor t;
    t.name = name;
    uint64_t elem_bytes = 0;
    if (!DtypeFromString(dt->get<std::string>(), &t.dtype, &elem_bytes)) {
      return Status::Unimplemented(path_ + ": tensor `" + Bounded(name) + "`: dtype " +
                                   Bounded(dt->get<std::string>()) +
                                   " is not supported (F32, F16, BF16)");
    }
    // Element count with overflow checks: a hostile shape must not wrap.
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) return tensor_bad("shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / v) {
        return tensor_bad("shape overflows");
      }
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& b = (*offsets)[0];
    const auto& en = (*offsets)[1];
    if (!b.is_number_unsigned() || !en.is_number_unsigned()) {
      return tensor_bad("data_offsets must be non-negative integers");
    }
    uint64_t begin = b.get<uint64_t>(), end = en.get<uint64_t>();
    if (begin > end || end > data_size) {
      return tensor_bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") outside the " + std::to_string(data_size) +
                        "-byte data section (truncated?)");
    }
    if (end - begin != numel * elem_bytes) {
      return tensor_bad("holds " + std::to_string(end - begin) + " bytes, shape and dtype need " +
                        std::to_string(numel * elem_bytes));
    }
    t.data = data + begin;
    t.nbytes = end - begin;
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  std::vector<const SafetensorsTensor*> order;
  order.reserve(tensors_.size());
  for (const SafetensorsTensor& t : tensors_) order.push_back(&t);
  if (std::string why = UntiledTensors(std::move(order), data, data_size); !why.empty()) {
    return bad(why);
  }
  return Status::Ok();
}

}  // namespace snapserve::model
