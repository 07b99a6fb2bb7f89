// SharedKvTier: the prefix cache's second tier in a shared store (Redis,
// ElastiCache), so replicas serving the same model reuse each other's
// prefills (docs/kv-cache-and-scheduling.md, "Shared tier in Redis").
//
// Two threads of its own, each with its own connection, do all network work;
// the scheduler thread only hands jobs over and takes results, never waits:
//   - the fetcher reads a request's missing chunks in chain order (stopping
//     at the first miss, a refused entry or the job's deadline) and queues
//     their K/V, checked and unpacked, for TakeFetched();
//   - the writer stores chunks computed locally, from a bounded queue
//     (SubmitWrite drops and counts when it is full), skipping chunks the
//     store has already (another replica wrote them), with a TTL.
// A store that cannot be reached costs hits, not requests: each thread backs
// off (doubling, up to kMaxBackoff) after a connection error and skips work
// meanwhile; errors are counted by kind and logged once per outage.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/status_or.h"
#include "engine/kv/store/chunk_entry.h"
#include "engine/kv/store/redis_connection.h"

namespace snapserve::kv {

struct SharedKvTierConfig {
  RedisEndpoint endpoint;
  ChunkEntryLayout layout;  // this model's: entries that differ are refused
  at::ScalarType dtype = at::kFloat;
  int64_t ttl_s = 3600;                       // 0: entries never expire
  std::chrono::milliseconds fetch_wait{500};  // longest a request waits for its lookups
  int64_t write_queue_chunks = 8;             // chunks waiting to be written, at most
};

// Error kinds counted (snapserve_kv_store_errors_total{kind}).
enum class KvStoreError {
  kConnect,    // cannot connect, TLS or AUTH failed
  kIo,         // a command failed or timed out on a connection
  kTruncated,  // refused entries (ChunkEntryError)
  kFormat,
  kChecksum,
  kWrongModel,
  kMismatch,   // an entry whose tokens or parent are not the prompt's
  kQueueFull,  // a write-back dropped: the queue was full
  kCount
};
const char* kv_store_error_name(KvStoreError kind);

struct KvStoreCounters {
  int64_t read_hits = 0;    // chunks read and served
  int64_t read_misses = 0;  // lookups the store did not have
  int64_t writes = 0;       // chunks written
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  std::array<int64_t, static_cast<size_t>(KvStoreError::kCount)> errors{};
};

// A chunk as the chain names it.
struct ChunkRef {
  uint64_t hash = 0;
  uint64_t parent = 0;
  std::vector<int32_t> tokens;
};

struct FetchedChunk {
  ChunkRef ref;
  at::Tensor k, v;  // [layers, KV heads, chunk tokens, head_dim], CPU
  // A write only: nonzero when k and v are views of a prefix-cache entry that
  // the writer pins until TakeWritten() hands the number back (the entry is
  // read in place, off the writer's thread, and must not be evicted meanwhile).
  uint64_t pin = 0;
};

struct FetchResult {
  int64_t owner = 0;                 // the sequence that asked
  std::vector<FetchedChunk> chunks;  // a prefix of what it asked, in chain order
};

class SharedKvTier {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kMinBackoff{100};
  static constexpr std::chrono::milliseconds kMaxBackoff{5000};

  // Starts the threads; the first connections are made there. Never fails
  // for an unreachable store (that costs hits); a bad config is INVALID_ARGUMENT.
  static StatusOr<std::unique_ptr<SharedKvTier>> Create(const SharedKvTierConfig& config);
  ~SharedKvTier();
  SharedKvTier(const SharedKvTier&) = delete;
  SharedKvTier& operator=(const SharedKvTier&) = delete;

  // Queues a lookup of `chunks` (in chain order) for `owner`; its result
  // arrives in TakeFetched() by `deadline` (perhaps with no chunk).
  void SubmitFetch(int64_t owner, std::vector<ChunkRef> chunks, Clock::time_point deadline);
  std::vector<FetchResult> TakeFetched();
  // Whether SubmitWrite would queue (false: it would drop); lets the caller
  // skip copying a chunk that would be dropped.
  bool WriteQueueHasRoom() const;
  // Queues a chunk for writing (k, v: CPU tensors it may keep); drops and
  // counts it when the queue is full.
  void SubmitWrite(FetchedChunk chunk);
  void CountDroppedWrite();
  // The pins (FetchedChunk::pin) of the writes done, failed or dropped since
  // the last call: their entries are no longer read.
  std::vector<uint64_t> TakeWritten();

  KvStoreCounters counters() const;
  // Called on the tier's threads with a line to log (an outage, a recovery).
  void SetLogger(std::function<void(const std::string&)> log);
  // Called on the fetcher thread after it queued a result (under the tier's
  // lock: after SetWakeup returns, the previous one is never called again).
  void SetWakeup(std::function<void()> wake);
  const SharedKvTierConfig& config() const { return config_; }

 private:
  explicit SharedKvTier(const SharedKvTierConfig& config);

  // One thread's connection with its backoff.
  struct Link {
    std::unique_ptr<RedisConnection> conn;
    Clock::time_point retry_at{};
    std::chrono::milliseconds backoff{0};
  };
  // A usable connection, connecting if the backoff allows; null otherwise.
  RedisConnection* Connected(Link& link, Clock::time_point deadline);
  void Failed(Link& link, KvStoreError kind, const Status& status);
  void Succeeded(Link& link);

  struct FetchJob {
    int64_t owner = 0;
    std::vector<ChunkRef> chunks;
    Clock::time_point deadline;
  };
  void FetchLoop();
  void WriteLoop();
  FetchResult Fetch(Link& link, const FetchJob& job);
  void Write(Link& link, const FetchedChunk& chunk);
  std::string Key(uint64_t hash) const;
  void Count(KvStoreError kind);
  void Log(const std::string& line);

  const SharedKvTierConfig config_;
  const std::string ttl_text_;

  mutable std::mutex mu_;
  std::condition_variable work_;
  bool stopping_ = false;
  std::deque<FetchJob> fetch_jobs_;
  std::vector<FetchResult> fetched_;
  std::deque<FetchedChunk> writes_;
  std::vector<uint64_t> written_pins_;
  std::function<void(const std::string&)> log_;
  std::function<void()> wake_;

  // Counters (read by counters() from any thread).
  std::atomic<int64_t> read_hits_{0}, read_misses_{0}, writes_done_{0}, bytes_read_{0},
      bytes_written_{0};
  std::array<std::atomic<int64_t>, static_cast<size_t>(KvStoreError::kCount)> errors_{};
  // Set by the first error of an outage, cleared by the next success: one
  // log line per outage and one per recovery.
  std::atomic<bool> outage_{false};
  std::atomic<int64_t> errors_in_outage_{0};

  std::thread fetcher_, writer_;
};

}  // namespace snapserve::kv
