// PagedKvCache: the serving engine's KvStore (docs/kv-cache-and-scheduling.md,
// "Paged KV cache"). Owns the per-layer key/value cache tensors, each
// [num_blocks, num_kv_heads, block_size, head_dim] on the model's device and
// dtype, the BlockPool that hands out their blocks and one BlockTable per
// sequence, shared by every layer and KV head. Prefill writes what a
// per-sequence selector keeps (everything by default; SnapKV plugs in there);
// decode appends one entry per sequence and runs the paged attention kernel. It
// never decides admission or compression policy: the scheduler asks it for
// room, the selector for entries.
//
// Thread-compatible: the scheduler thread owns it (no locking). The KvStore
// methods report misuse and an exhausted pool by throwing c10::Error, as every
// forward-pass failure does; the engine turns that into a Status.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/common/status.h"
#include "engine/common/status_or.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"
#include "engine/model/kv_store.h"

namespace snapserve::kv {

struct PagedKvCacheConfig {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;  // see NumBlocksForBudget
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
};

// Chooses the entries of one prefill layer to cache: gets the layer index and
// post-RoPE q [num_heads, n, d], k/v [num_kv_heads, n, d]; returns the kept
// k/v [num_kv_heads, m, d] in position order, with the same m for every layer.
using KvSelector = std::function<std::pair<at::Tensor, at::Tensor>(
    int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

class PagedKvCache : public model::KvStore {
 public:
  // Allocates the cache tensors; INVALID_ARGUMENT for a bad config,
  // RESOURCE_EXHAUSTED when the device cannot hold them.
  static StatusOr<std::unique_ptr<PagedKvCache>> Create(const PagedKvCacheConfig& config);

  // Blocks that fit in `budget_bytes` with `config`'s shape and dtype.
  static int32_t NumBlocksForBudget(const PagedKvCacheConfig& config, int64_t budget_bytes);

  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  // Registers `seq` and reserves room for `reserve_tokens` entries up front
  // (admission reserves min(n, C) + max_new_tokens, so generation never runs
  // out of blocks midway). RESOURCE_EXHAUSTED (nothing reserved) when the pool
  // lacks the blocks; INVALID_ARGUMENT if `seq` is already registered.
  Status AddSequence(int64_t seq, int64_t reserve_tokens, KvSelector selector = nullptr);
  // Frees every block of `seq`; unknown ids are ignored (cancel paths may race
  // with completion).
  void RemoveSequence(int64_t seq);
  // Replaces the selector StorePrefillLayer applies to `seq` (nullptr: keep all).
  void SetSelector(int64_t seq, KvSelector selector);

  bool HasSequence(int64_t seq) const { return seqs_.contains(seq); }
  // Entries cached for `seq` (per layer and KV head; identical for all of them).
  int64_t num_tokens(int64_t seq) const;
  // Whether `tokens` entries could be reserved now / on an empty pool.
  bool CanReserve(int64_t tokens) const;
  bool CanEverFit(int64_t tokens) const;

  int64_t num_free_blocks() const { return pool_.num_free(); }
  int64_t num_total_blocks() const { return pool_.num_total(); }
  // Fraction of blocks held by sequences (reserved counts as used).
  double usage_ratio() const;
  int32_t block_size() const { return config_.block_size; }
  const PagedKvCacheConfig& config() const { return config_; }

  // KvStore. Prefill appends the selected entries after whatever `seq` already
  // holds; the count becomes visible once the last layer is stored. A decode
  // step's entry is likewise committed after its last layer, so all layers of
  // one step attend over the same context length.
  void StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v) override;
  // A decode step's device-side tables (block tables, context lengths, the
  // new entries' slots) are built once in BeginDecodeStep and reused by every
  // layer; EndDecodeStep commits one entry per sequence.
  void BeginDecodeStep(const std::vector<int64_t>& seqs) override;
  at::Tensor DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v) override;
  void EndDecodeStep() override;

  // Dense copies [num_kv_heads, num_tokens(seq), d] of what is cached for
  // `seq` at `layer`, for tests and parity checks.
  std::pair<at::Tensor, at::Tensor> Gather(int64_t seq, int64_t layer) const;
  const at::Tensor& key_cache(int64_t layer) const { return key_caches_.at(layer); }
  const at::Tensor& value_cache(int64_t layer) const { return value_caches_.at(layer); }

 private:
  explicit PagedKvCache(const PagedKvCacheConfig& config);

  struct Sequence {
    explicit Sequence(int32_t block_size) : table(block_size) {}
    BlockTable table;
    KvSelector selector;
    // Prefill in progress: the next layer expected, the entry count chosen at
    // layer 0 and the slots they go to (reused by every layer).
    int64_t prefill_next_layer = 0;
    int64_t prefill_len = 0;
    at::Tensor prefill_slots;
  };
  // One decode step's device-side tables, built by BeginDecodeStep and reused
  // by every layer (one host-to-device copy per step, not per layer).
  struct DecodeStep {
    std::vector<int64_t> seqs;
    int64_t next_layer = 0;
    at::Tensor block_tables;  // [B, max_blocks] int32
    at::Tensor context_lens;  // [B] int32, the new entry included
    at::Tensor slots;         // [B] int64, where the new entry goes
  };

  Sequence& Find(int64_t seq);
  const Sequence& Find(int64_t seq) const;

  PagedKvCacheConfig config_;
  BlockPool pool_;
  at::Tensor storage_;  // [2, num_layers, num_blocks, num_kv_heads, block_size, head_dim]
  std::vector<at::Tensor> key_caches_;    // views of storage_[0][layer]
  std::vector<at::Tensor> value_caches_;  // views of storage_[1][layer]
  std::unordered_map<int64_t, Sequence> seqs_;
  std::optional<DecodeStep> step_;
};

}  // namespace snapserve::kv
