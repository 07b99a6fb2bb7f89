#include "engine/kv/store/shared_kv_tier.h"

#include <ATen/ATen.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace snapserve::kv {

namespace {

// A write has this long to connect and send one chunk (megabytes).
constexpr std::chrono::seconds kWriteTimeout{5};

// A peer that closed a TLS connection raises SIGPIPE in the thread that
// writes to it (OpenSSL writes with write(), not send(MSG_NOSIGNAL)):
// blocked here, the write fails with EPIPE instead of ending the process.
void BlockSigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

KvStoreError FromEntryError(ChunkEntryError e) {
  switch (e) {
    case ChunkEntryError::kTruncated:
      return KvStoreError::kTruncated;
    case ChunkEntryError::kChecksum:
      return KvStoreError::kChecksum;
    case ChunkEntryError::kWrongModel:
      return KvStoreError::kWrongModel;
    case ChunkEntryError::kFormat:
    case ChunkEntryError::kNone:
      break;
  }
  return KvStoreError::kFormat;
}

std::span<const std::byte> Bytes(const at::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), static_cast<size_t>(t.nbytes())};
}

}  // namespace

const char* kv_store_error_name(KvStoreError kind) {
  switch (kind) {
    case KvStoreError::kConnect:
      return "connect";
    case KvStoreError::kIo:
      return "io";
    case KvStoreError::kTruncated:
      return "truncated";
    case KvStoreError::kFormat:
      return "format";
    case KvStoreError::kChecksum:
      return "checksum";
    case KvStoreError::kWrongModel:
      return "wrong_model";
    case KvStoreError::kMismatch:
      return "mismatch";
    case KvStoreError::kQueueFull:
      return "queue_full";
    case KvStoreError::kCount:
      break;
  }
  return "unknown";
}

StatusOr<std::unique_ptr<SharedKvTier>> SharedKvTier::Create(const SharedKvTierConfig& config) {
  if (config.endpoint.host.empty()) return Status::InvalidArgument("kv_store: no host");
  if (config.layout.HalfPayloadBytes() == 0) {
    return Status::InvalidArgument("kv_store: empty chunk layout");
  }
  if (config.ttl_s < 0 || config.write_queue_chunks < 0 || config.fetch_wait.count() < 0) {
    return Status::InvalidArgument("kv_store: TTL, wait and queue must not be negative");
  }
  return std::unique_ptr<SharedKvTier>(new SharedKvTier(config));
}

SharedKvTier::SharedKvTier(const SharedKvTierConfig& config)
    : config_(config), ttl_text_(std::to_string(config.ttl_s)) {
  fetcher_ = std::thread([this] { FetchLoop(); });
  writer_ = std::thread([this] { WriteLoop(); });
}

SharedKvTier::~SharedKvTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  fetcher_.join();
  writer_.join();
}

void SharedKvTier::SubmitFetch(int64_t owner, std::vector<ChunkRef> chunks,
                               Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fetch_jobs_.push_back({owner, std::move(chunks), deadline});
  }
  work_.notify_all();
}

std::vector<FetchResult> SharedKvTier::TakeFetched() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(fetched_, {});
}

bool SharedKvTier::WriteQueueHasRoom() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(writes_.size()) < config_.write_queue_chunks;
}

void SharedKvTier::SubmitWrite(FetchedChunk chunk) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int64_t>(writes_.size()) >= config_.write_queue_chunks) {
      Count(KvStoreError::kQueueFull);
      if (chunk.pin != 0) written_pins_.push_back(chunk.pin);
      return;
    }
    writes_.push_back(std::move(chunk));
  }
  work_.notify_all();
}

void SharedKvTier::CountDroppedWrite() { Count(KvStoreError::kQueueFull); }

std::vector<uint64_t> SharedKvTier::TakeWritten() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(written_pins_, {});
}

KvStoreCounters SharedKvTier::counters() const {
  KvStoreCounters c;
  c.read_hits = read_hits_.load();
  c.read_misses = read_misses_.load();
  c.writes = writes_done_.load();
  c.bytes_read = bytes_read_.load();
  c.bytes_written = bytes_written_.load();
  for (size_t i = 0; i < c.errors.size(); ++i) c.errors[i] = errors_[i].load();
  return c;
}

void SharedKvTier::SetLogger(std::function<void(const std::string&)> log) {
  std::lock_guard<std::mutex> lock(mu_);
  log_ = std::move(log);
}

void SharedKvTier::SetWakeup(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

void SharedKvTier::Count(KvStoreError kind) { ++errors_[static_cast<size_t>(kind)]; }

void SharedKvTier::Log(const std::string& line) {
  std::function<void(const std::string&)> log;
  {
    std::lock_guard<std::mutex> lock(mu_);
    log = log_;
  }
  if (log) {
    log(line);
  } else {
    std::fprintf(stderr, "kv store: %s\n", line.c_str());
  }
}

std::string SharedKvTier::Key(uint64_t hash) const {
  char key[48];
  std::snprintf(key, sizeof(key), "snapserve:kv:v%u:%016llx",
                static_cast<unsigned>(kChunkEntryVersion), static_cast<unsigned long long>(hash));
  return key;
}

RedisConnection* SharedKvTier::Connected(Link& link, Clock::time_point deadline) {
  if (link.conn != nullptr && !link.conn->broken()) return link.conn.get();
  link.conn.reset();
  if (Clock::now() < link.retry_at) return nullptr;  // backing off: skip the work
  StatusOr<std::unique_ptr<RedisConnection>> c =
      RedisConnection::Connect(config_.endpoint, deadline);
  if (!c.ok()) {
    Failed(link, KvStoreError::kConnect, c.status());
    return nullptr;
  }
  link.conn = std::move(*c);
  return link.conn.get();
}

void SharedKvTier::Failed(Link& link, KvStoreError kind, const Status& status) {
  Count(kind);
  link.conn.reset();
  link.backoff = std::clamp(link.backoff * 2, std::chrono::milliseconds(kMinBackoff), kMaxBackoff);
  link.retry_at = Clock::now() + link.backoff;
  if (!outage_.exchange(true)) {
    errors_in_outage_.store(1);
    Log("unreachable, serving without it and retrying with backoff: " + status.message());
  } else {
    ++errors_in_outage_;
  }
}

void SharedKvTier::Succeeded(Link& link) {
  link.backoff = std::chrono::milliseconds(0);
  if (outage_.exchange(false)) {
    Log("reachable again after " + std::to_string(errors_in_outage_.load()) + " errors");
  }
}

void SharedKvTier::FetchLoop() {
  BlockSigpipe();
  Link link;
  while (true) {
    FetchJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !fetch_jobs_.empty(); });
      if (stopping_) return;
      job = std::move(fetch_jobs_.front());
      fetch_jobs_.pop_front();
    }
    FetchResult result = Fetch(link, job);
    // Called under the lock: once SetWakeup({}) returns, the old wakeup
    // (the scheduler's) is never called again.
    std::lock_guard<std::mutex> lock(mu_);
    fetched_.push_back(std::move(result));
    if (wake_) wake_();
  }
}

FetchResult SharedKvTier::Fetch(Link& link, const FetchJob& job) {
  FetchResult out;
  out.owner = job.owner;
  const ChunkEntryLayout& layout = config_.layout;
  for (const ChunkRef& chunk : job.chunks) {
    if (Clock::now() >= job.deadline) break;
    RedisConnection* conn = Connected(link, job.deadline);
    if (conn == nullptr) break;
    const std::string key = Key(chunk.hash);
    // GETEX renews the TTL of what is read: a prefix in use stays.
    StatusOr<RedisReply> reply = config_.ttl_s > 0
                                     ? conn->Command({"GETEX", key, "EX", ttl_text_}, job.deadline)
                                     : conn->Command({"GET", key}, job.deadline);
    if (!reply.ok()) {
      Failed(link, KvStoreError::kIo, reply.status());
      break;
    }
    Succeeded(link);
    if (reply->type == RedisReply::Type::kNil) {
      ++read_misses_;
      break;
    }
    if (reply->type != RedisReply::Type::kString) {
      Count(reply->type == RedisReply::Type::kError ? KvStoreError::kIo : KvStoreError::kFormat);
      Log("lookup of " + key + " answered " +
          (reply->type == RedisReply::Type::kError ? reply->str.substr(0, 200) : "a non-string"));
      break;
    }
    bytes_read_ += static_cast<int64_t>(reply->str.size());
    DecodedChunkEntry entry;
    const ChunkEntryError error = DecodeChunkEntry(reply->str, layout, chunk.hash, &entry);
    if (error != ChunkEntryError::kNone) {
      // Deleted, so the chunk this replica now computes is written back in
      // its place.
      Count(FromEntryError(error));
      Log("refused entry " + key + " (" + chunk_entry_error_name(error) +
          "): deleted, the chunk is recomputed");
      if (!conn->Command({"DEL", key}, job.deadline).ok()) link.conn.reset();
      break;
    }
    if (entry.parent != chunk.parent || entry.tokens != chunk.tokens) {
      Count(KvStoreError::kMismatch);  // another prefix under the same hash
      break;
    }
    const std::vector<int64_t> shape = {layout.num_layers, layout.num_kv_heads, layout.chunk_tokens,
                                        layout.head_dim};
    at::Tensor k = at::empty(shape, at::TensorOptions().dtype(config_.dtype));
    at::Tensor v = at::empty(shape, at::TensorOptions().dtype(config_.dtype));
    std::memcpy(k.data_ptr(), entry.k.data(), entry.k.size());
    std::memcpy(v.data_ptr(), entry.v.data(), entry.v.size());
    ++read_hits_;
    out.chunks.push_back({chunk, std::move(k), std::move(v)});
  }
  return out;
}

void SharedKvTier::WriteLoop() {
  BlockSigpipe();
  Link link;
  while (true) {
    FetchedChunk chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !writes_.empty(); });
      if (stopping_) return;
      chunk = std::move(writes_.front());
      writes_.pop_front();
    }
    Write(link, chunk);
    if (chunk.pin != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      written_pins_.push_back(chunk.pin);
    }
  }
}

void SharedKvTier::Write(Link& link, const FetchedChunk& chunk) {
  const Clock::time_point deadline = Clock::now() + kWriteTimeout;
  RedisConnection* conn = Connected(link, deadline);
  if (conn == nullptr) return;
  const std::string key = Key(chunk.ref.hash);
  // Another replica may have written it: then only its TTL is renewed.
  StatusOr<RedisReply> exists = conn->Command({"EXISTS", key}, deadline);
  if (!exists.ok()) return Failed(link, KvStoreError::kIo, exists.status());
  Succeeded(link);
  if (exists->type == RedisReply::Type::kInteger && exists->integer > 0) {
    if (config_.ttl_s > 0) {
      StatusOr<RedisReply> renewed = conn->Command({"EXPIRE", key, ttl_text_}, deadline);
      if (!renewed.ok()) Failed(link, KvStoreError::kIo, renewed.status());
    }
    return;
  }
  const std::string entry = EncodeChunkEntry(config_.layout, chunk.ref.hash, chunk.ref.parent,
                                             chunk.ref.tokens, Bytes(chunk.k), Bytes(chunk.v));
  if (entry.empty()) return Count(KvStoreError::kFormat);
  StatusOr<RedisReply> set = config_.ttl_s > 0
                                 ? conn->Command({"SET", key, entry, "EX", ttl_text_}, deadline)
                                 : conn->Command({"SET", key, entry}, deadline);
  if (!set.ok()) return Failed(link, KvStoreError::kIo, set.status());
  if (set->type == RedisReply::Type::kError) {
    // Refused by the store itself (OOM under maxmemory with noeviction, ...).
    Count(KvStoreError::kIo);
    Log("write of " + key + " refused: " + set->str.substr(0, 200));
    return;
  }
  ++writes_done_;
  bytes_written_ += static_cast<int64_t>(entry.size());
}

}  // namespace snapserve::kv
