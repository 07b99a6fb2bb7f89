// BlockPool: the fixed set of KV-cache block ids shared by every sequence
// (docs/kv-cache-and-scheduling.md, "Paged KV cache"). It hands out and takes
// back integer ids only; the memory the ids index lives in PagedKvCache's
// per-layer tensors. It never touches tensors.
//
// Thread-compatible, not thread-safe: the scheduler thread owns the pool and is
// the only caller (admission, growth and release all happen on that thread).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/common/status.h"
#include "engine/common/status_or.h"

namespace snapserve::kv {

class BlockPool {
 public:
  // A pool of `num_blocks` blocks with ids 0 .. num_blocks-1, all free.
  explicit BlockPool(int32_t num_blocks);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Bytes one block occupies over the whole model: K and V, every layer and
  // KV head, block_size tokens of head_dim elements.
  static int64_t BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t block_size,
                               int64_t head_dim, int64_t dtype_size);
  // How many blocks fit in `budget_bytes` (0 when not even one does).
  static int32_t BlocksForBudget(int64_t budget_bytes, int64_t bytes_per_block);

  // Takes `n` free blocks, all or nothing: RESOURCE_EXHAUSTED (pool unchanged)
  // when fewer than `n` are free, INVALID_ARGUMENT when n < 0. O(n).
  StatusOr<std::vector<int32_t>> Allocate(int64_t n);

  // Returns `blocks` to the pool, all or nothing: a block that is out of range,
  // already free or listed twice yields INVALID_ARGUMENT and frees nothing.
  Status Free(const std::vector<int32_t>& blocks);

  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_total() const { return static_cast<int32_t>(allocated_.size()); }
  int32_t num_used() const { return num_total() - num_free(); }
  bool is_allocated(int32_t block) const;

 private:
  // Free ids as a stack: the most recently freed block is reused first, which
  // keeps the working set of a lightly loaded pool small.
  std::vector<int32_t> free_;
  // allocated_[id] != 0 while `id` belongs to some sequence; this is what makes
  // double frees and foreign ids detectable instead of corrupting the stack.
  std::vector<uint8_t> allocated_;
};

}  // namespace snapserve::kv
