// DocumentCache: documents kept compressed across requests
// (docs/kv-cache-and-scheduling.md, "Document cache"). A request that sends a
// `question` marks its prompt as a document: the prompt is prefilled and
// compressed alone, as kvpress compresses a context before any question, and
// what its policy keeps of every layer is stored here under the prompt's
// tokens and the compression settings. A later request with the same
// document and settings but another question restores those kept entries
// into its own lanes and runs only its question.
//
// Unlike PrefixCache's full chunks, an entry is what one policy kept, so it
// serves only requests that ask for the same policy and budget; a policy that
// reads no query (KeyDiff, StreamingLLM) keeps the same entries whatever the
// question, which is what makes the reuse sound (docs/compression-policies.md,
// "Documents and questions").
//
// Memory: entries are allocated when stored, and evicted least recently used
// first to keep their bytes within `capacity_bytes`. An entry is shared by
// the requests that use it (shared_ptr), so eviction never frees one in use.
//
// Thread-compatible: the scheduler thread owns it (no locking).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv/paged_kv_cache.h"

namespace snapserve::kv {

struct CompressedDocument {
  std::vector<int32_t> tokens;  // the document's prompt tokens
  std::string settings;         // the compression settings it was kept under
  std::vector<KeptKv> layers;   // what the policy kept of each layer
  bool compressed = false;      // whether the policy dropped entries
  // The kept entries' share of the window's attention (Usage's
  // retained_attention_ratio); negative when not measured.
  double retained_attention = -1;
  int64_t bytes = 0;
  int64_t entries = 0;  // kept entries summed over layers and KV heads
};

class DocumentCache {
 public:
  explicit DocumentCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
  DocumentCache(const DocumentCache&) = delete;
  DocumentCache& operator=(const DocumentCache&) = delete;

  // The entry for exactly these tokens and settings, marked as just used;
  // nullptr on a miss.
  std::shared_ptr<const CompressedDocument> Lookup(std::span<const int32_t> tokens,
                                                   const std::string& settings);
  // Stores `doc` (its bytes and entries are computed here), evicting least
  // recently used entries to make room. False when it alone exceeds the
  // capacity. An entry for the same tokens and settings is replaced.
  bool Insert(CompressedDocument doc);

  int64_t capacity_bytes() const { return capacity_bytes_; }
  int64_t bytes_used() const { return bytes_used_; }
  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    std::shared_ptr<const CompressedDocument> doc;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: most recent)
  };
  static uint64_t Key(std::span<const int32_t> tokens, const std::string& settings);
  void Erase(uint64_t key);

  int64_t capacity_bytes_;
  int64_t bytes_used_ = 0;
  int64_t evictions_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;
};

}  // namespace snapserve::kv
