// PagedKvCache: the serving engine's KvStore (docs/kv-cache-and-scheduling.md,
// "Paged KV cache"). Every (layer, KV head) pair of a sequence is a *lane*
// with its own BlockTable, so a layer or a head may keep fewer entries than
// another (PyramidKV, AdaKV: docs/compression-policies.md) and the memory it
// does not keep is never taken. All lanes draw on one BlockPool whose blocks
// each hold block_size entries of one lane: one key and one value tensor
// [num_blocks, 1, block_size, head_dim] serve every layer. Prefill writes
// what a per-sequence selector keeps (everything by default); decode appends
// one entry per lane and runs the paged attention kernel with each lane as a
// row of one KV head. It never decides admission or compression policy: the
// scheduler asks it for room, the selector for entries.
//
// Mistral's sliding window (PagedKvCacheConfig::sliding_window = W): each lane
// is a ring of W entries, the lane's e-th entry at ring index e % W, so a lane
// holds its last W entries and decode attends over exactly those; an older
// entry is overwritten, as no later query may see it. Without compression
// those are the last W positions, transformers' window. A compressed lane's
// kept prompt entries carry no positions (a selector hands over rows, not
// where they came from), so there the window counts entries, not positions.
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
  int32_t num_blocks = 0;  // lane blocks (one layer and KV head each); see NumBlocksForBudget
  // float32, bfloat16, float16, or int8 (CPU: int8 values with a float32
  // scale per 16, kernels/kv_append/kv_append.h).
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  // Zero the cache at creation, so every page is resident from the start
  // (EngineOptions::kv_cache_prefault says why).
  bool prefault = false;
  // The model's sliding window (ModelConfig::sliding_window); 0: none. A lane
  // then never holds more than this many entries.
  int64_t sliding_window = 0;
};

// What a selector keeps of one prefill layer: k/v [num_kv_heads, m, d] in
// position order per head. With head_lengths empty every head keeps all m
// rows; otherwise head g keeps its first head_lengths[g] rows (AdaKV) and the
// rest is padding.
struct KeptKv {
  at::Tensor k;
  at::Tensor v;
  std::vector<int64_t> head_lengths;
};

// Chooses the entries of one prefill layer to cache: gets the layer index and
// post-RoPE q [num_heads, r, d] (the last r queries), k/v [num_kv_heads, n, d].
// Layers may keep different counts, and so may heads (KeptKv::head_lengths).
using KvSelector = std::function<KeptKv(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v)>;

// What one sequence may hold, for admission: entries per KV head of each
// layer (prompt kept + max_new_tokens); with heads_share the heads of a layer
// hold that many times num_kv_heads together in any split (AdaKV).
struct LaneReservation {
  std::vector<int64_t> entries_per_layer;
  bool heads_share = false;
};

class PagedKvCache : public model::KvStore {
 public:
  // Allocates the cache tensors; INVALID_ARGUMENT for a bad config,
  // RESOURCE_EXHAUSTED when the device cannot hold them.
  static StatusOr<std::unique_ptr<PagedKvCache>> Create(const PagedKvCacheConfig& config);

  // Lane blocks that fit in `budget_bytes` with `config`'s shape and dtype.
  static int32_t NumBlocksForBudget(const PagedKvCacheConfig& config, int64_t budget_bytes);
  // Bytes of one lane block (K and V).
  static int64_t BytesPerBlock(const PagedKvCacheConfig& config);

  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  // Blocks that `reservation` needs in the worst case: per layer
  // num_kv_heads * ceil(entries / block_size), or with heads_share
  // floor((num_kv_heads * (entries + block_size - 1)) / block_size), the most
  // any split of the layer's entries over its heads can take. With a sliding
  // window, entries beyond it need no blocks (a lane holds at most W).
  int64_t BlocksFor(const LaneReservation& reservation) const;
  // The same for `tokens` entries in every lane (no compression).
  int64_t BlocksForUniform(int64_t tokens) const;

  // Registers `seq` and takes `reserve_blocks` blocks up front (admission
  // reserves BlocksFor(what the request can ever hold), so generation never
  // runs out midway); its lanes grow from them. RESOURCE_EXHAUSTED (nothing
  // reserved) when the pool lacks the blocks; INVALID_ARGUMENT if `seq` is
  // already registered.
  Status AddSequence(int64_t seq, int64_t reserve_blocks, KvSelector selector = nullptr);
  // Frees every block of `seq`; unknown ids are ignored (cancel paths may race
  // with completion).
  void RemoveSequence(int64_t seq);
  // Replaces the selector StorePrefillLayer applies to `seq` (nullptr: keep all).
  void SetSelector(int64_t seq, KvSelector selector);

  bool HasSequence(int64_t seq) const { return seqs_.contains(seq); }
  // Entries cached for `seq` in one lane / summed over every lane (with a
  // sliding window, at most W per lane).
  int64_t num_tokens(int64_t seq, int64_t layer = 0, int64_t kv_head = 0) const;
  int64_t total_entries(int64_t seq) const;
  // Bytes of the blocks `seq`'s lanes hold (whole blocks; the unused rest of
  // its reservation is not counted).
  int64_t bytes_held(int64_t seq) const;
  // Whether `blocks` blocks could be reserved now / on an empty pool.
  bool CanReserve(int64_t blocks) const { return blocks <= pool_.num_free(); }
  bool CanEverFit(int64_t blocks) const { return blocks <= pool_.num_total(); }

  int64_t num_free_blocks() const { return pool_.num_free(); }
  int64_t num_total_blocks() const { return pool_.num_total(); }
  // Fraction of blocks held by sequences (reserved counts as used).
  double usage_ratio() const;
  int32_t block_size() const { return config_.block_size; }
  const PagedKvCacheConfig& config() const { return config_; }
  // Whether the pool asked for 2 MiB pages and the kernel took the advice
  // (CPU caches on Linux; kernels/cpu/huge_pages.h). Logged at startup.
  bool huge_pages() const { return huge_pages_; }

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

  // Dense copies of what is cached for `seq`, for tests and parity checks:
  // one lane [num_tokens(seq, layer, g), d], or a layer [num_kv_heads, m, d]
  // whose heads all hold m entries (throws otherwise). In slot order: with a
  // sliding window, ring order.
  std::pair<at::Tensor, at::Tensor> GatherLane(int64_t seq, int64_t layer, int64_t kv_head) const;
  std::pair<at::Tensor, at::Tensor> Gather(int64_t seq, int64_t layer) const;
  // [num_blocks, 1, block_size, head_dim]: every lane's blocks.
  const at::Tensor& key_cache() const { return key_cache_; }
  const at::Tensor& value_cache() const { return value_cache_; }
  // An int8 cache's scales, [num_blocks, 1, block_size, head_dim / 16]
  // float32; undefined for the other dtypes.
  const at::Tensor& key_scales() const { return key_scales_; }
  const at::Tensor& value_scales() const { return value_scales_; }

 private:
  explicit PagedKvCache(const PagedKvCacheConfig& config);

  struct Sequence {
    std::vector<BlockTable> lanes;  // lane (l, g) at l * num_kv_heads + g
    // Entries ever written to each lane: its num_tokens(), or with a sliding
    // window the count whose remainder mod W is the next ring index.
    std::vector<int64_t> written;
    std::vector<int32_t> spare;  // reserved blocks no lane uses yet
    KvSelector selector;
    // Prefill in progress: the next layer expected. Each layer's entries are
    // written past what its lanes hold and committed after the last layer,
    // so an abandoned prefill leaves nothing behind.
    int64_t prefill_next_layer = 0;
    std::vector<int64_t> prefill_lengths;  // per lane, written but not committed
  };
  // One decode step's device-side tables, built by BeginDecodeStep for every
  // layer at once (one host-to-device copy per step, not per layer). Row
  // b * num_kv_heads + g is lane g of sequence b.
  struct DecodeStep {
    std::vector<int64_t> seqs;
    int64_t next_layer = 0;
    at::Tensor block_tables;  // [L, B * G, max_blocks] int32
    at::Tensor context_lens;  // [L, B * G] int32, the new entry included
    at::Tensor slots;         // [L, B * G] int64, where the new entry goes
  };

  // Writes rows (float32, or the cache's dtype) at `slots`, quantizing them
  // for an int8 cache.
  void Append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots);
  // The dtype rows are handed to Append in: the cache's, float32 for int8.
  at::ScalarType row_dtype() const {
    return config_.dtype == at::kChar ? at::kFloat : config_.dtype;
  }

  Sequence& Find(int64_t seq);
  const Sequence& Find(int64_t seq) const;
  BlockTable& Lane(Sequence& s, int64_t layer, int64_t kv_head);
  // Grows `lane` to hold `tokens` entries, from the sequence's spare blocks
  // first, then from the pool.
  Status Grow(Sequence& s, BlockTable& lane, int64_t tokens);
  // Entries a lane holds after `written` were written to it, and where the
  // entry counted `entry` (from the lane's first) lives in it: the identity,
  // or with a sliding window W at most W and the ring index entry % W.
  int64_t Held(int64_t written) const;
  int64_t RingIndex(int64_t entry) const;
  // Commits `added` more entries to lane `i` of `s`.
  void Commit(Sequence& s, size_t i, int64_t added);

  PagedKvCacheConfig config_;
  BlockPool pool_;
  at::Tensor storage_;  // [2, num_blocks, 1, block_size, head_dim]
  bool huge_pages_ = false;
  at::Tensor key_cache_;      // storage_[0]
  at::Tensor value_cache_;    // storage_[1]
  at::Tensor scale_storage_;  // int8 only: [2, num_blocks, 1, block_size, head_dim / 16]
  at::Tensor key_scales_;     // scale_storage_[0]
  at::Tensor value_scales_;   // scale_storage_[1]
  std::unordered_map<int64_t, Sequence> seqs_;
  std::optional<DecodeStep> step_;
};

}  // namespace snapserve::kv
