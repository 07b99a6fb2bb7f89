#include "engine/kv/prefix_cache.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace snapserve::kv {

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t FnvBytes(uint64_t h, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

// splitmix64's finalizer: FNV-1a alone mixes its last bytes poorly.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Little-endian bytes of integers, so the hash is the same on every host.
uint64_t FnvLe(uint64_t h, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    h ^= (value >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

}  // namespace

uint64_t StableHash(std::string_view text) {
  return Mix(FnvBytes(kFnvOffset, text.data(), text.size()));
}

int64_t PrefixCache::BytesPerChunk(const PrefixCacheConfig& c) {
  return 2 * c.num_layers * c.num_kv_heads * c.chunk_tokens * c.head_dim *
         static_cast<int64_t>(c10::elementSize(c.dtype));
}

StatusOr<std::unique_ptr<PrefixCache>> PrefixCache::Create(const PrefixCacheConfig& config) {
  if (config.num_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0 ||
      config.chunk_tokens <= 0) {
    return Status::InvalidArgument(
        "PrefixCache: layers, KV heads, head_dim and chunk_tokens must be positive");
  }
  if (config.capacity_chunks <= 0) {
    return Status::InvalidArgument("prefix cache: its memory holds no chunk of " +
                                   std::to_string(config.chunk_tokens) + " tokens (" +
                                   std::to_string(BytesPerChunk(config)) + " bytes each)");
  }
  try {
    return std::unique_ptr<PrefixCache>(new PrefixCache(config));
  } catch (const c10::Error& e) {
    return Status::ResourceExhausted(std::string("PrefixCache: allocation failed: ") +
                                     e.what_without_backtrace());
  }
}

PrefixCache::PrefixCache(const PrefixCacheConfig& config) : config_(config) {
  storage_ = at::empty({config.capacity_chunks, 2, config.num_layers, config.num_kv_heads,
                        config.chunk_tokens, config.head_dim},
                       at::TensorOptions().dtype(config.dtype).device(config.device));
  // Popped from the back: slot 0 first.
  for (int64_t s = config.capacity_chunks - 1; s >= 0; --s) free_slots_.push_back(s);
}

double PrefixCache::usage_ratio() const {
  return 1.0 - static_cast<double>(free_slots_.size()) / static_cast<double>(capacity_chunks());
}

uint64_t PrefixCache::ChunkHash(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = FnvLe(kFnvOffset, config_.fingerprint, 8);
  h = FnvLe(h, parent, 8);
  for (int32_t t : tokens) h = FnvLe(h, static_cast<uint32_t>(t), 4);
  return Mix(h);
}

std::vector<uint64_t> PrefixCache::ChainHashes(std::span<const int32_t> tokens) const {
  const int64_t c = config_.chunk_tokens;
  const int64_t chunks = static_cast<int64_t>(tokens.size()) / c;
  std::vector<uint64_t> hashes;
  hashes.reserve(static_cast<size_t>(chunks));
  uint64_t parent = config_.fingerprint;
  for (int64_t i = 0; i < chunks; ++i) {
    parent = ChunkHash(parent, tokens.subspan(static_cast<size_t>(i * c), static_cast<size_t>(c)));
    hashes.push_back(parent);
  }
  return hashes;
}

bool PrefixCache::Matches(const Entry& e, uint64_t parent, std::span<const int32_t> tokens) {
  return e.parent == parent && e.tokens.size() == tokens.size() &&
         std::equal(tokens.begin(), tokens.end(), e.tokens.begin());
}

void PrefixCache::Touch(uint64_t hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
}

int64_t PrefixCache::CachedChunks(std::span<const int32_t> tokens,
                                  const std::vector<uint64_t>& hashes, int64_t max_chunks) {
  const int64_t c = config_.chunk_tokens;
  const int64_t limit = std::min<int64_t>(max_chunks, static_cast<int64_t>(hashes.size()));
  int64_t found = 0;
  uint64_t parent = config_.fingerprint;
  while (found < limit) {
    auto it = entries_.find(hashes[static_cast<size_t>(found)]);
    const auto chunk = tokens.subspan(static_cast<size_t>(found * c), static_cast<size_t>(c));
    if (it == entries_.end() || !Matches(it->second, parent, chunk)) break;
    parent = hashes[static_cast<size_t>(found)];
    ++found;
  }
  // Last chunk first, so the chain's first chunks end up the most recent.
  for (int64_t i = found - 1; i >= 0; --i) Touch(hashes[static_cast<size_t>(i)]);
  return found;
}

void PrefixCache::CopyOut(const std::vector<uint64_t>& hashes, int64_t chunks,
                          const std::vector<at::Tensor>& keys,
                          const std::vector<at::Tensor>& values) const {
  const int64_t c = config_.chunk_tokens;
  TORCH_CHECK(
      static_cast<int64_t>(keys.size()) == config_.num_layers && values.size() == keys.size(),
      "PrefixCache: one key and value buffer per layer");
  for (int64_t i = 0; i < chunks; ++i) {
    auto it = entries_.find(hashes[static_cast<size_t>(i)]);
    TORCH_CHECK(it != entries_.end(), "PrefixCache: chunk ", i, " is not cached");
    const at::Tensor k = SlotKeys(it->second.slot);  // [L, Hkv, c, D]
    const at::Tensor v = SlotValues(it->second.slot);
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      keys[static_cast<size_t>(l)].narrow(1, i * c, c).copy_(k[l]);
      values[static_cast<size_t>(l)].narrow(1, i * c, c).copy_(v[l]);
    }
  }
}

std::optional<int64_t> PrefixCache::TakeSlot() {
  if (free_slots_.empty()) {
    // Least recently used first, skipping pinned entries.
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      auto e = entries_.find(*it);
      if (e->second.pins > 0) continue;
      const int64_t slot = e->second.slot;
      lru_.erase(e->second.lru);
      slot_hash_.erase(slot);
      entries_.erase(e);
      free_slots_.push_back(slot);
      ++evictions_;
      break;
    }
  }
  if (free_slots_.empty()) return std::nullopt;
  const int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void PrefixCache::AddEntry(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens,
                           int64_t slot) {
  lru_.push_front(hash);
  Entry e;
  e.slot = slot;
  e.parent = parent;
  e.tokens = std::move(tokens);
  e.lru = lru_.begin();
  entries_.emplace(hash, std::move(e));
  slot_hash_[slot] = hash;
}

void PrefixCache::BeginInsert(int64_t owner, std::span<const int32_t> tokens,
                              const std::vector<uint64_t>& hashes) {
  AbortInsert(owner);
  const int64_t c = config_.chunk_tokens;
  // The chain's cached chunks must outlive the insertion: evicting one would
  // make the chunks after it unreachable.
  std::vector<uint64_t> pinned;
  for (uint64_t h : hashes) {
    auto it = entries_.find(h);
    if (it == entries_.end()) continue;
    ++it->second.pins;
    pinned.push_back(h);
  }
  std::vector<PendingChunk> chunks;
  uint64_t parent = config_.fingerprint;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const auto chunk = tokens.subspan(i * static_cast<size_t>(c), static_cast<size_t>(c));
    auto it = entries_.find(hashes[i]);
    if (it != entries_.end() && Matches(it->second, parent, chunk)) {
      parent = hashes[i];
      continue;
    }
    // A colliding entry of another prefix keeps its slot; this chunk is
    // then not cached (rare enough not to matter).
    if (it != entries_.end()) break;
    const std::optional<int64_t> slot = TakeSlot();
    if (!slot.has_value()) break;
    chunks.push_back({static_cast<int64_t>(i), *slot, hashes[i], parent,
                      std::vector<int32_t>(chunk.begin(), chunk.end())});
    parent = hashes[i];
  }
  for (uint64_t h : pinned) --entries_.at(h).pins;
  // The chain is touched from its end, as CachedChunks does.
  for (auto i = static_cast<int64_t>(hashes.size()) - 1; i >= 0; --i) {
    Touch(hashes[static_cast<size_t>(i)]);
  }
  if (!chunks.empty()) pending_[owner] = std::move(chunks);
}

void PrefixCache::WriteLayer(int64_t owner, int64_t layer, const at::Tensor& k,
                             const at::Tensor& v) {
  auto it = pending_.find(owner);
  if (it == pending_.end()) return;
  const int64_t c = config_.chunk_tokens;
  for (const PendingChunk& p : it->second) {
    SlotKeys(p.slot)[layer].copy_(k.narrow(1, p.index * c, c));
    SlotValues(p.slot)[layer].copy_(v.narrow(1, p.index * c, c));
  }
}

std::vector<int64_t> PrefixCache::CommitInsert(int64_t owner) {
  std::vector<int64_t> added;
  auto it = pending_.find(owner);
  if (it == pending_.end()) return added;
  std::vector<PendingChunk> chunks = std::move(it->second);
  pending_.erase(it);
  // Added last to first: the chain's first chunks end up the most recent.
  for (auto p = chunks.rbegin(); p != chunks.rend(); ++p) {
    if (entries_.contains(p->hash)) {
      free_slots_.push_back(p->slot);  // another prompt inserted it meanwhile
    } else {
      AddEntry(p->hash, p->parent, std::move(p->tokens), p->slot);
      added.push_back(p->index);
    }
  }
  std::reverse(added.begin(), added.end());
  return added;
}

void PrefixCache::AbortInsert(int64_t owner) {
  auto it = pending_.find(owner);
  if (it == pending_.end()) return;
  for (const PendingChunk& p : it->second) free_slots_.push_back(p.slot);
  pending_.erase(it);
}

PrefixCache::ChunkHandle::ChunkHandle(PrefixCache* cache, int64_t slot, at::Tensor k, at::Tensor v)
    : cache_(cache), slot_(slot), k_(std::move(k)), v_(std::move(v)) {}

PrefixCache::ChunkHandle::ChunkHandle(ChunkHandle&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      slot_(other.slot_),
      k_(std::move(other.k_)),
      v_(std::move(other.v_)) {}

PrefixCache::ChunkHandle::~ChunkHandle() {
  if (cache_ != nullptr) cache_->Unpin(slot_);
}

void PrefixCache::Unpin(int64_t slot) {
  auto h = slot_hash_.find(slot);
  if (h == slot_hash_.end()) return;
  --entries_.at(h->second).pins;
}

std::optional<PrefixCache::ChunkHandle> PrefixCache::Lookup(uint64_t hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return std::nullopt;
  ++it->second.pins;
  Touch(hash);
  const int64_t slot = it->second.slot;
  return ChunkHandle(this, slot, SlotKeys(slot), SlotValues(slot));
}

bool PrefixCache::Insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                         const at::Tensor& k, const at::Tensor& v) {
  if (static_cast<int64_t>(tokens.size()) != config_.chunk_tokens ||
      ChunkHash(parent, tokens) != hash) {
    return false;
  }
  const std::vector<int64_t> shape = {config_.num_layers, config_.num_kv_heads,
                                      config_.chunk_tokens, config_.head_dim};
  if (k.sizes() != at::IntArrayRef(shape) || v.sizes() != at::IntArrayRef(shape)) return false;
  if (entries_.contains(hash)) return true;
  const std::optional<int64_t> slot = TakeSlot();
  if (!slot.has_value()) return false;
  SlotKeys(*slot).copy_(k);
  SlotValues(*slot).copy_(v);
  AddEntry(hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end()), *slot);
  return true;
}

}  // namespace snapserve::kv
