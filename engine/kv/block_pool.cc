#include "engine/kv/block_pool.h"

#include <string>

namespace snapserve::kv {

BlockPool::BlockPool(int32_t num_blocks) {
  const int32_t n = num_blocks > 0 ? num_blocks : 0;
  allocated_.assign(static_cast<size_t>(n), 0);
  free_.reserve(static_cast<size_t>(n));
  // Push in reverse so that a fresh pool hands out 0, 1, 2, ... (readable logs).
  for (int32_t id = n - 1; id >= 0; --id) free_.push_back(id);
}

int64_t BlockPool::BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t block_size,
                                 int64_t head_dim, int64_t dtype_size) {
  return 2 * num_layers * num_kv_heads * block_size * head_dim * dtype_size;
}

int32_t BlockPool::BlocksForBudget(int64_t budget_bytes, int64_t bytes_per_block) {
  if (budget_bytes <= 0 || bytes_per_block <= 0) return 0;
  const int64_t n = budget_bytes / bytes_per_block;
  // Block ids are int32 in the block tables the kernels read.
  constexpr int64_t kMaxBlocks = INT32_MAX;
  return static_cast<int32_t>(n < kMaxBlocks ? n : kMaxBlocks);
}

bool BlockPool::is_allocated(int32_t block) const {
  return block >= 0 && block < num_total() && allocated_[static_cast<size_t>(block)] != 0;
}

StatusOr<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  if (n < 0) return Status::InvalidArgument("BlockPool::Allocate: negative block count");
  if (n > num_free()) {
    return Status::ResourceExhausted("KV cache: " + std::to_string(n) + " blocks requested, " +
                                     std::to_string(num_free()) + " of " +
                                     std::to_string(num_total()) + " free");
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    allocated_[static_cast<size_t>(id)] = 1;
    out.push_back(id);
  }
  return out;
}

Status BlockPool::Free(const std::vector<int32_t>& blocks) {
  // Validate by clearing the marks as we go; on the first bad id, restore the
  // marks already cleared so the pool is exactly as it was.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t id = blocks[i];
    if (!is_allocated(id)) {
      for (size_t j = 0; j < i; ++j) allocated_[static_cast<size_t>(blocks[j])] = 1;
      const bool in_range = id >= 0 && id < num_total();
      return Status::InvalidArgument(
          "BlockPool::Free: block " + std::to_string(id) +
          (in_range ? " is not allocated (double free)" : " does not belong to this pool"));
    }
    allocated_[static_cast<size_t>(id)] = 0;
  }
  for (int32_t id : blocks) free_.push_back(id);
  return Status::Ok();
}

}  // namespace snapserve::kv
