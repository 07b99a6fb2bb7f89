#include "engine/kv/block_table.h"

#include <c10/util/Exception.h>

namespace snapserve::kv {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  TORCH_CHECK(block_size > 0, "BlockTable: block_size must be positive, got ", block_size);
}

Status BlockTable::EnsureCapacity(int64_t tokens, BlockPool& pool) {
  const int64_t need = BlocksFor(tokens, block_size_) - static_cast<int64_t>(block_ids_.size());
  if (need <= 0) return Status::Ok();
  SNAPSERVE_ASSIGN_OR_RETURN(const std::vector<int32_t> blocks, pool.Allocate(need));
  block_ids_.insert(block_ids_.end(), blocks.begin(), blocks.end());
  return Status::Ok();
}

Status BlockTable::Release(BlockPool& pool) {
  Status st = pool.Free(block_ids_);
  // Even on error the table forgets its ids: keeping them would only retry a
  // free the pool has already refused.
  block_ids_.clear();
  num_tokens_ = 0;
  return st;
}

void BlockTable::set_num_tokens(int64_t n) {
  TORCH_CHECK(n >= 0 && n <= capacity(), "BlockTable: ", n, " tokens do not fit in capacity ",
              capacity());
  num_tokens_ = n;
}

Slot BlockTable::slot(int64_t token) const {
  TORCH_CHECK(token >= 0 && token < capacity(), "BlockTable: token ", token, " outside capacity ",
              capacity());
  return Slot{block_ids_[static_cast<size_t>(token / block_size_)],
              static_cast<int32_t>(token % block_size_)};
}

int64_t BlockTable::slot_index(int64_t token) const {
  const Slot s = slot(token);
  return static_cast<int64_t>(s.block) * block_size_ + s.offset;
}

}  // namespace snapserve::kv
