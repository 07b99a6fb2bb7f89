// BlockTable: one sequence's logical-to-physical map into the BlockPool
// (docs/kv-cache-and-scheduling.md, "Paged KV cache"). Token t of the sequence
// lives in block block_ids[t / B] at offset t % B (B = block_size). PagedKvCache
// keeps one table per (layer, KV head) lane of a sequence, since compression
// policies may keep different counts in each. It owns ids, not memory, and
// never touches tensors.
//
// Thread-compatible: used only on the scheduler thread, like the pool.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/common/status.h"
#include "engine/kv/block_pool.h"

namespace snapserve::kv {

// Where one token's K/V entry lives.
struct Slot {
  int32_t block;
  int32_t offset;
};

class BlockTable {
 public:
  explicit BlockTable(int32_t block_size);

  // Grows the table until it can hold `tokens` entries, taking the missing
  // blocks from `pool` all or nothing (RESOURCE_EXHAUSTED leaves it unchanged).
  // Never shrinks.
  Status EnsureCapacity(int64_t tokens, BlockPool& pool);

  // Appends blocks the caller took from the pool (or from a reservation).
  void AddBlocks(const std::vector<int32_t>& blocks) {
    block_ids_.insert(block_ids_.end(), blocks.begin(), blocks.end());
  }

  // Gives every block back to `pool` and empties the table.
  Status Release(BlockPool& pool);

  // Entries the table's blocks can hold / entries actually written.
  int64_t capacity() const { return static_cast<int64_t>(block_ids_.size()) * block_size_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Records how many entries are written; must not exceed capacity().
  void set_num_tokens(int64_t n);

  Slot slot(int64_t token) const;
  // The flat index block * block_size + offset that kv_append takes.
  int64_t slot_index(int64_t token) const;

  int32_t block_size() const { return block_size_; }
  const std::vector<int32_t>& block_ids() const { return block_ids_; }

  // Blocks needed to hold `tokens` entries.
  static int64_t BlocksFor(int64_t tokens, int32_t block_size) {
    return tokens <= 0 ? 0 : (tokens + block_size - 1) / block_size;
  }

 private:
  int32_t block_size_;
  int64_t num_tokens_ = 0;
  std::vector<int32_t> block_ids_;
};

}  // namespace snapserve::kv
