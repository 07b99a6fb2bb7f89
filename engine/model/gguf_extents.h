// Where a GGUF file's tensors lie in its data section, checked as arithmetic
// only (no file, no LibTorch): the byte size a tensor's type and shape imply,
// and that the tensors tile the data section, each inside it, none
// overlapping another, no bytes unaccounted for between them. A tensor whose
// type code was corrupted into another type of a different block size
// changes its implied size, so its extent runs into its neighbour (overlap)
// or falls short of it (a gap): both are refused here. A corruption into a
// type with the same bytes per element (F16 <-> BF16, F32 <-> I32) keeps
// every extent and is invisible to these checks; the loader's list of types
// it accepts for each tensor (gguf_tensor_plan.h) is the only guard then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace snapserve::model {

// a * b, or nullopt when it does not fit in 64 bits.
std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b);

// Bytes of a tensor of `dims` (GGUF order, dims[0] the row) stored as blocks
// of `block_elements` elements in `block_bytes` bytes. Sets `*why` and
// returns nullopt when a dim is negative, the row is not a whole number of
// blocks, or the size overflows.
std::optional<uint64_t> TensorByteSize(const std::vector<int64_t>& dims, int64_t block_elements,
                                       int64_t block_bytes, std::string* why);

struct TensorExtent {
  std::string name;
  uint64_t offset;  // from the start of the data section
  uint64_t nbytes;
};

// OK when every extent lies inside [0, data_size), no two overlap, and, if
// `expect_tiling`, each starts where the one before ends (rounded up to
// `alignment`, GGUF's padding), the first at 0, and the data section ends
// within `alignment` bytes of the last. Messages name the tensor(s) (names
// bounded in length) without the file; the caller prefixes it.
Status CheckTensorExtents(std::vector<TensorExtent> extents, uint64_t data_size, uint64_t alignment,
                          bool expect_tiling);

}  // namespace snapserve::model
