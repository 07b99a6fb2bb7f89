#include "engine/model/gguf_extents.h"

#include <algorithm>

#include "engine/model/gguf_file.h"

namespace snapserve::model {
namespace {

std::string Quoted(const std::string& name) { return "tensor '" + ShownName(name) + "'"; }

std::string Range(const TensorExtent& e) {
  return "[" + std::to_string(e.offset) + ", " + std::to_string(e.offset + e.nbytes) + ")";
}

// Rounds up to a multiple of `alignment` (a power of two); nullopt on overflow.
std::optional<uint64_t> AlignUp(uint64_t v, uint64_t alignment) {
  if (v > UINT64_MAX - (alignment - 1)) return std::nullopt;
  return (v + alignment - 1) / alignment * alignment;
}

}  // namespace

std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::optional<uint64_t> TensorByteSize(const std::vector<int64_t>& dims, int64_t block_elements,
                                       int64_t block_bytes, std::string* why) {
  if (block_elements <= 0 || block_bytes <= 0) {
    *why = "has a type of unknown block size";
    return std::nullopt;
  }
  for (int64_t d : dims) {
    if (d < 0) {
      *why = "has a negative dimension";
      return std::nullopt;
    }
  }
  const int64_t row = dims.empty() ? 1 : dims[0];
  if (row % block_elements != 0) {
    *why = "has ne[0]=" + std::to_string(row) + ", not a multiple of its block size " +
           std::to_string(block_elements);
    return std::nullopt;
  }
  uint64_t blocks = static_cast<uint64_t>(row / block_elements);
  for (size_t d = 1; d < dims.size(); ++d) {
    std::optional<uint64_t> next = CheckedMul(blocks, static_cast<uint64_t>(dims[d]));
    if (!next) {
      *why = "has an absurd shape (its element count overflows)";
      return std::nullopt;
    }
    blocks = *next;
  }
  std::optional<uint64_t> bytes = CheckedMul(blocks, static_cast<uint64_t>(block_bytes));
  if (!bytes) {
    *why = "has an absurd size (its byte count overflows)";
    return std::nullopt;
  }
  return bytes;
}

Status CheckTensorExtents(std::vector<TensorExtent> extents, uint64_t data_size, uint64_t alignment,
                          bool expect_tiling) {
  for (const TensorExtent& e : extents) {
    if (e.offset > data_size || e.nbytes > data_size - e.offset) {
      return Status::InvalidArgument(Quoted(e.name) + " extends past end of file (bytes " +
                                     Range(e) + " of a data section of " +
                                     std::to_string(data_size) + ")");
    }
  }
  std::stable_sort(
      extents.begin(), extents.end(),
      [](const TensorExtent& a, const TensorExtent& b) { return a.offset < b.offset; });
  uint64_t expected_start = 0;  // where the next tensor starts if they tile the section
  for (size_t i = 0; i < extents.size(); ++i) {
    const TensorExtent& e = extents[i];
    if (i > 0) {
      const TensorExtent& prev = extents[i - 1];
      // Sorted by offset and each inside the section, so prev.offset + prev.nbytes fits.
      if (e.offset < prev.offset + prev.nbytes) {
        return Status::InvalidArgument(Quoted(prev.name) + " (bytes " + Range(prev) +
                                       ") overlaps " + Quoted(e.name) + " (bytes " + Range(e) +
                                       ")");
      }
    }
    if (expect_tiling && e.offset > expected_start) {
      return Status::InvalidArgument(
          std::to_string(e.offset - expected_start) + " bytes before " + Quoted(e.name) + " (at " +
          std::to_string(e.offset) + ") belong to no tensor: " +
          (i == 0 ? std::string("the first tensor must start the data section")
                  : "the tensor before it, " + Quoted(extents[i - 1].name) +
                        ", is smaller than its type and shape imply, or one was skipped"));
    }
    expected_start = AlignUp(e.offset + e.nbytes, alignment).value_or(UINT64_MAX);
  }
  if (expect_tiling && !extents.empty() && data_size > expected_start) {
    return Status::InvalidArgument(std::to_string(data_size - expected_start) +
                                   " bytes after the last tensor, " + Quoted(extents.back().name) +
                                   ", belong to no tensor");
  }
  return Status::Ok();
}

}  // namespace snapserve::model
