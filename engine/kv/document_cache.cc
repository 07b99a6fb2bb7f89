#include "engine/kv/document_cache.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "engine/kv/prefix_cache.h"

namespace snapserve::kv {

uint64_t DocumentCache::Key(std::span<const int32_t> tokens, const std::string& settings) {
  const std::string_view bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  return StableHash(bytes) ^ (StableHash(settings) * 0x9e3779b97f4a7c15ull);
}

std::shared_ptr<const CompressedDocument> DocumentCache::Lookup(std::span<const int32_t> tokens,
                                                                const std::string& settings) {
  const auto it = entries_.find(Key(tokens, settings));
  if (it == entries_.end()) return nullptr;
  const CompressedDocument& doc = *it->second.doc;
  // The key is a hash: a collision must not serve another document.
  if (doc.settings != settings || !std::ranges::equal(doc.tokens, tokens)) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.doc;
}

bool DocumentCache::Insert(CompressedDocument doc) {
  doc.bytes = 0;
  doc.entries = 0;
  for (const KeptKv& layer : doc.layers) {
    doc.bytes += static_cast<int64_t>(layer.k.nbytes() + layer.v.nbytes());
    if (layer.head_lengths.empty()) {
      doc.entries += layer.k.size(0) * layer.k.size(1);
    } else {
      for (int64_t len : layer.head_lengths) doc.entries += len;
    }
  }
  if (doc.bytes > capacity_bytes_) return false;
  const uint64_t key = Key(doc.tokens, doc.settings);
  Erase(key);
  while (bytes_used_ + doc.bytes > capacity_bytes_ && !lru_.empty()) {
    Erase(lru_.back());
    ++evictions_;
  }
  bytes_used_ += doc.bytes;
  lru_.push_front(key);
  entries_.emplace(key,
                   Entry{std::make_shared<const CompressedDocument>(std::move(doc)), lru_.begin()});
  return true;
}

void DocumentCache::Erase(uint64_t key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return;
  bytes_used_ -= it->second.doc->bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

}  // namespace snapserve::kv
