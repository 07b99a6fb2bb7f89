// The engine's whole public face (modelled on TensorRT-LLM's executor.h): start
// it on a model, enqueue requests with a sink, cancel them by id, shut it
// down. Everything else lives behind the pimpl. This header includes no
// LibTorch, gRPC or protobuf header, so the server can include it while never
// seeing LibTorch's include directories (docs/architecture.md, "Build targets
// and dependencies").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/common/status.h"
#include "engine/common/status_or.h"
#include "engine/engine_types.h"
#include "engine/model/linear_precision.h"
#include "engine/result_sink.h"
#include "engine/token_logprobs.h"

namespace snapserve::engine {

// Every default of the engine, in one place: the server's flags start from
// these (server/server_config.h holds an EngineOptions).
struct EngineOptions {
  std::string model_path;  // .gguf file or Hugging Face directory
  std::string model_id;    // reported name; default: the file name
  Dtype dtype = Dtype::kFloat32;
  // Element type of the paged KV cache; unset: default_kv_cache_dtype(dtype).
  // bfloat16 halves the bytes every decode step reads per cached token and
  // doubles the tokens kv_cache_memory_bytes holds (docs/kv-cache-and-scheduling.md).
  std::optional<Dtype> kv_cache_dtype;
  Device device = Device::Cpu();
  // The linear layers' arithmetic (engine/model/linear_precision.h): the
  // GGUF decode dot (exact or int8), the prompt GEMM (float32, bfloat16 or
  // int8) and the bfloat16-weight decode dot, from which each matrix's kernel
  // is chosen once at load. The server resolves it from --precision
  // (engine/precision.h); the defaults are the exact paths.
  model::LinearPrecision linear_precision;
  int threads = 0;  // intra-op threads; 0: LibTorch's default

  int64_t kv_cache_memory_bytes = int64_t{2} << 30;
  // Write every KV cache page once at start, so the process holds the whole
  // cache from the first second: resident memory then stays flat under load
  // (no growth as new peaks of concurrency first touch blocks), and a pod
  // whose memory limit cannot hold the cache fails at start, not under load.
  // Off by default: tests and laptops start many servers that never fill it
  // (docs/kv-cache-and-scheduling.md, "Memory when idle").
  bool kv_cache_prefault = false;
  int block_size = 16;
  int max_batch_size = 16;
  int max_queue = 256;
  int max_new_tokens_limit = 4096;
  int default_max_new_tokens = 256;
  // Most prompt tokens in prefill at once: admission adds no prompt beyond it,
  // except that the head of the queue is admitted whatever its length when no
  // other prompt is in prefill. A prompt split into chunks holds its K/V of
  // every layer until its last chunk, so this bounds that memory. Not a
  // server flag.
  int64_t max_prefill_tokens_per_step = 4096;
  // Prompt tokens one step computes, beside one token per decoding sequence
  // (scheduler/step_planner.h); prompts are cut into chunks of this size.
  // Smaller: shorter gaps while prompts arrive, but more of them; larger:
  // fewer, longer gaps and larger GEMMs. The default is measured
  // (docs/kv-cache-and-scheduling.md, "Chunked prefill").
  int64_t max_step_tokens = 2048;

  // The prefix cache (docs/kv-cache-and-scheduling.md, "Prefix cache"): the
  // share of kv_cache_memory_bytes that holds prompt chunks' K/V across
  // requests (the paged cache gets the rest); 0: no prefix cache.
  double prefix_cache_memory_share = 0;
  // The document cache (docs/kv-cache-and-scheduling.md, "Document cache"):
  // the share of kv_cache_memory_bytes that keeps documents compressed for
  // later questions (taken from the paged cache); 0: none.
  double document_cache_memory_share = 0;
  // Tokens per cached chunk; must divide max_step_tokens. Prompts then run
  // in pieces cut on this grid, so a cached prefix and a cold prefill
  // compute the same numbers. Not a server flag.
  int64_t prefix_cache_chunk_tokens = 256;

  // The prefix cache's shared tier (docs/kv-cache-and-scheduling.md,
  // "Shared tier in Redis"): chunks missing locally are looked up there and
  // chunks computed here are written there. Needs the prefix cache.
  struct KvStore {
    std::string url;            // redis://host:port[/db] or rediss://...; empty: off
    bool tls = false;           // TLS also for a redis:// URL
    std::string tls_ca_file;    // empty: the system's CA store
    std::string user;           // ACL user; empty: AUTH with the password alone
    std::string password;       // never logged
    std::string password_file;  // read at start when password is empty
    int64_t ttl_s = 3600;       // 0: entries never expire
    // Longest a request waits for its chunks' lookups before its prefill.
    int64_t fetch_wait_ms = 500;
    int64_t write_queue_chunks = 8;  // chunks waiting to be written, at most
  } kv_store;

  // What a request that leaves kv_compression fields unset gets.
  KvCompressionConfig default_kv_compression;
};

// The shared tier's counters since start (all zero without one).
struct KvStoreStats {
  int64_t read_hits = 0;    // chunks read from the store and used
  int64_t read_misses = 0;  // lookups the store did not have
  int64_t writes = 0;       // chunks written
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  // Errors by kind: connect, io, truncated, format, checksum, wrong_model,
  // mismatch, queue_full (every kind listed, zeros included).
  std::vector<std::pair<std::string, int64_t>> errors;
};
// The kinds of KvStoreStats::errors, in its order.
std::vector<std::string> KvStoreErrorKinds();

struct ChatMessage {
  std::string role;
  std::string content;
};

struct GenerationRequest {
  std::string request_id;  // must be unique among requests in flight
  // Exactly one input: text, token ids, or chat messages.
  std::optional<std::string> prompt;
  std::optional<std::vector<uint32_t>> input_ids;
  std::optional<std::vector<ChatMessage>> messages;
  // For `prompt`: special-token strings in it are plain text, not control
  // tokens. Message content is always plain text; token ids are taken as given.
  bool split_special_tokens = false;
  // Makes the input a document (docs/api.md, "Documents and questions"): the
  // input is prefilled and compressed alone, then the question's tokens run
  // after it uncompressed, before the first generated token. With `messages`
  // the question ends the last message and the chat template's tail follows
  // it; otherwise its tokens follow the input's. Empty: no document.
  std::string question;

  float temperature = 0;  // 0: greedy
  uint32_t top_k = 0;
  float top_p = 0;               // 0 or 1: off
  float repetition_penalty = 0;  // 0 or 1: off
  std::optional<uint64_t> seed;

  uint32_t max_new_tokens = 0;  // 0: server default
  std::vector<std::string> stop;
  std::vector<uint32_t> stop_token_ids;
  bool ignore_eos = false;

  KvCompressionOverrides kv_compression;
  LogprobOptions logprobs;  // off: no logprobs, and no cost
  // Work stops with DEADLINE_EXCEEDED once passed.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // When the request reached the server (queue and latency figures count from here).
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

struct ModelSummary {
  std::string model_id;
  std::string architecture;
  uint32_t num_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;
  uint32_t head_dim = 0;
  uint32_t vocab_size = 0;
  uint32_t max_context_length = 0;
  Dtype dtype = Dtype::kFloat32;
  Dtype kv_cache_dtype = Dtype::kFloat32;
  Device device;
  KvCompressionConfig default_kv_compression;
  uint32_t max_new_tokens_limit = 0;
  uint32_t max_batch_size = 0;
  uint64_t kv_cache_capacity_tokens = 0;
};

class Engine {
 public:
  // Loads the model and tokenizer, sizes the KV cache, starts the scheduler
  // thread. `progress` receives human-readable loading lines.
  static StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, const std::function<void(const std::string&)>& progress = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelSummary& model() const;

  // Validates the request (INVALID_ARGUMENT naming the field), renders and
  // tokenizes its input, and queues it. RESOURCE_EXHAUSTED when the queue is
  // full or the request could never fit in the KV cache; UNAVAILABLE after
  // Shutdown. On OK the sink gets OnFinish exactly once; on error never.
  Status Enqueue(GenerationRequest request, std::shared_ptr<ResultSink> sink);

  // Stops a queued or running request: its sink finishes with CANCELLED and
  // its blocks are freed. Unknown or finished ids are ignored.
  void Cancel(const std::string& request_id);

  // split_special_tokens: as GenerationRequest's.
  StatusOr<std::vector<uint32_t>> Tokenize(std::string_view text, bool add_special_tokens,
                                           bool split_special_tokens = false) const;

  // The raw bytes token `id` stands for (possibly part of a UTF-8
  // character; empty when out of range): the OpenAI API's logprob tokens.
  std::string TokenBytes(uint32_t id) const;

  EngineStats stats() const;
  void SetObserver(EngineObserver observer);
  KvStoreStats kv_store_stats() const;
  // Receives the shared tier's log lines (outages, recoveries, refused
  // entries), on the tier's threads.
  void SetKvStoreLogger(std::function<void(const std::string&)> log);

  // Finishes every queued and running request with UNAVAILABLE and stops the
  // thread. Idempotent; the destructor calls it. (Draining — letting running
  // requests complete first — is the server's job: it stops enqueueing and
  // waits for its calls before calling this.)
  void Shutdown();

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace snapserve::engine
