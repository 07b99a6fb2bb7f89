// PrefixCache: prompt K/V kept across requests, in chunks of a fixed number
// of tokens (docs/kv-cache-and-scheduling.md, "Prefix cache"). A chunk is
// named by a chain hash: hash(previous chunk's hash, the chunk's tokens), the
// first chunk's "previous hash" being the model fingerprint (the model file,
// dtypes and precision paths the K/V depend on). So a chunk's name covers the
// whole prefix before it, and one entry is the K/V of every layer and KV head
// of its chunk given that prefix.
//
// Entries hold the full, uncompressed post-RoPE K/V in the model's compute
// dtype: exactly the rows a prompt in chunks keeps in its PromptState, so a
// request that starts from cached chunks sees the bits a cold prefill would
// have computed, and its compression selector picks the same entries. The
// request copies what it hits into its own prompt buffers at admission; the
// entries stay for the next request.
//
// Memory is one allocation of `capacity_chunks` slots made at start. Entries
// are evicted least recently used first when an insertion needs a slot;
// entries pinned by a live ChunkHandle are never evicted. A chain is touched
// from its last chunk to its first, so a chain's first chunks (shared by the
// most prompts) are the last to go.
//
// Thread-compatible: the scheduler thread owns it (no locking).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::kv {

struct PrefixCacheConfig {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t chunk_tokens = 256;
  int64_t capacity_chunks = 0;
  // The model's compute dtype: the dtype of the K/V a prompt's chunks hold.
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  // Hash of everything the K/V depend on besides the tokens (ModelFingerprint).
  uint64_t fingerprint = 0;
};

// A stable 64-bit hash of `text` (FNV-1a, then a final mix): the same on
// every machine and process, so a shared store can name chunks with it.
uint64_t StableHash(std::string_view text);

class PrefixCache {
 public:
  // INVALID_ARGUMENT for a bad config, RESOURCE_EXHAUSTED when the memory
  // cannot be allocated.
  static StatusOr<std::unique_ptr<PrefixCache>> Create(const PrefixCacheConfig& config);
  // Bytes of one chunk (K and V of every layer and KV head).
  static int64_t BytesPerChunk(const PrefixCacheConfig& config);

  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The chain hashes of the full chunks of `tokens` (tokens.size() /
  // chunk_tokens of them, a trailing partial chunk has none).
  std::vector<uint64_t> ChainHashes(std::span<const int32_t> tokens) const;

  // How many leading chunks of `tokens` (hashes: ChainHashes(tokens)) are
  // cached, at most `max_chunks`. An entry counts only if its tokens and its
  // parent equal the prompt's, so a hash collision can never serve another
  // prompt's K/V. Marks the chunks found as just used.
  int64_t CachedChunks(std::span<const int32_t> tokens, const std::vector<uint64_t>& hashes,
                       int64_t max_chunks);
  // Copies the first `chunks` chunks (found by CachedChunks) into per-layer
  // prompt buffers keys[l] / values[l] [num_kv_heads, n, head_dim], at
  // positions [0, chunks * chunk_tokens).
  void CopyOut(const std::vector<uint64_t>& hashes, int64_t chunks,
               const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values) const;

  // Insertion from a prompt's last chunk, one layer at a time (the K/V of a
  // layer exists only while that layer runs). BeginInsert takes a slot for
  // every full chunk of `tokens` not cached yet (evicting least recently used
  // entries; chunks past the free and evictable slots are skipped),
  // WriteLayer copies layer `layer`'s rows from k/v [num_kv_heads, n,
  // head_dim], CommitInsert makes them visible (and returns the chunk
  // indices it added, for a shared tier to write back), AbortInsert gives the
  // slots back. One pending insertion per `owner`; a second BeginInsert
  // replaces it.
  void BeginInsert(int64_t owner, std::span<const int32_t> tokens,
                   const std::vector<uint64_t>& hashes);
  void WriteLayer(int64_t owner, int64_t layer, const at::Tensor& k, const at::Tensor& v);
  std::vector<int64_t> CommitInsert(int64_t owner);
  void AbortInsert(int64_t owner);

  // One chunk's K/V, the interface a shared tier (another process, a store
  // such as Redis) uses: k/v [num_layers, num_kv_heads, chunk_tokens,
  // head_dim] are views into the cache, and the entry cannot be evicted while
  // the handle lives.
  class ChunkHandle {
   public:
    ChunkHandle(ChunkHandle&& other) noexcept;
    ChunkHandle& operator=(ChunkHandle&&) = delete;
    ~ChunkHandle();
    const at::Tensor& k() const { return k_; }
    const at::Tensor& v() const { return v_; }

   private:
    friend class PrefixCache;
    ChunkHandle(PrefixCache* cache, int64_t slot, at::Tensor k, at::Tensor v);
    PrefixCache* cache_;
    int64_t slot_;
    at::Tensor k_, v_;
  };
  std::optional<ChunkHandle> Lookup(uint64_t hash);
  // Stores a chunk whose K/V came from elsewhere: `parent` is the previous
  // chunk's hash (the fingerprint for a first chunk), `tokens` the chunk's
  // chunk_tokens tokens, k/v as ChunkHandle's. False when `hash` is not the
  // chain hash of (parent, tokens), or no slot is free or evictable.
  bool Insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, const at::Tensor& k,
              const at::Tensor& v);

  int64_t chunk_tokens() const { return config_.chunk_tokens; }
  int64_t capacity_chunks() const { return config_.capacity_chunks; }
  // Entries held (pending insertions not counted), and evictions so far.
  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_free_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  int64_t evictions() const { return evictions_; }
  // Share of the slots holding entries or pending insertions.
  double usage_ratio() const;
  const PrefixCacheConfig& config() const { return config_; }

 private:
  explicit PrefixCache(const PrefixCacheConfig& config);

  struct Entry {
    int64_t slot = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    int64_t pins = 0;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: most recent)
  };
  struct PendingChunk {
    int64_t index = 0;  // chunk index in the prompt
    int64_t slot = 0;
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
  };

  uint64_t ChunkHash(uint64_t parent, std::span<const int32_t> tokens) const;
  // Whether `e` is the entry of (parent, tokens).
  static bool Matches(const Entry& e, uint64_t parent, std::span<const int32_t> tokens);
  void Touch(uint64_t hash);
  // A free slot, evicting the least recently used unpinned entry if needed;
  // nullopt when every slot is held or pinned.
  std::optional<int64_t> TakeSlot();
  void AddEntry(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens, int64_t slot);
  at::Tensor SlotKeys(int64_t slot) const { return storage_[slot][0]; }
  at::Tensor SlotValues(int64_t slot) const { return storage_[slot][1]; }
  void Unpin(int64_t slot);

  PrefixCacheConfig config_;
  at::Tensor storage_;  // [capacity, 2, num_layers, num_kv_heads, chunk_tokens, head_dim]
  std::vector<int64_t> free_slots_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<int64_t, uint64_t> slot_hash_;  // slot -> hash, for entries
  std::list<uint64_t> lru_;
  std::unordered_map<int64_t, std::vector<PendingChunk>> pending_;
  int64_t evictions_ = 0;
};

}  // namespace snapserve::kv
