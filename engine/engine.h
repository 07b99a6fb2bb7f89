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
#include <vector>

#include "engine/common/status.h"
#include "engine/common/status_or.h"

namespace snapserve::engine {

struct EngineOptions {
  std::string model_path;  // .gguf file or Hugging Face directory
  std::string model_id;    // reported name; default: the file name
  std::string dtype = "float32";
  std::string device = "cpu";
  int threads = 0;  // intra-op threads; 0: LibTorch's default

  int64_t kv_cache_memory_bytes = int64_t{2} << 30;
  int block_size = 16;
  int max_batch_size = 16;
  int max_queue = 256;
  int max_new_tokens_limit = 4096;
  int default_max_new_tokens = 256;
  // Most prompt tokens in prefill at once: admission adds no prompt beyond it,
  // except that the head of the queue is admitted whatever its length when no
  // other prompt is in prefill. Not a server flag. (What keeps running streams
  // going while long prompts arrive is prefill_chunk_tokens.)
  int64_t max_prefill_tokens_per_step = 4096;
  // While other requests decode, prefill work between two decode steps, in
  // prompt tokens' worth of whole layers (scheduler.h); 0: whole prompts.
  int64_t prefill_chunk_tokens = 512;

  std::string default_kv_method = "snapkv";  // snapkv|none
  int snapkv_window = 32;
  int snapkv_capacity = 1024;
  int snapkv_kernel = 7;
  std::string snapkv_pooling = "max";  // max|avg
};

enum class KvMethod { kUnspecified, kNone, kSnapKv };
enum class KvPooling { kUnspecified, kMax, kAvg };
enum class FinishReason { kUnspecified, kLength, kEos, kStopSequence, kStopToken };

// Mirrors the API's KvCompression: zero / unspecified fields take server defaults.
struct KvCompressionOptions {
  KvMethod method = KvMethod::kUnspecified;
  uint32_t window_size = 0;
  uint32_t max_capacity_prompt = 0;
  uint32_t kernel_size = 0;
  KvPooling pooling = KvPooling::kUnspecified;
};

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

  float temperature = 0;  // 0: greedy
  uint32_t top_k = 0;
  float top_p = 0;               // 0 or 1: off
  float repetition_penalty = 0;  // 0 or 1: off
  std::optional<uint64_t> seed;

  uint32_t max_new_tokens = 0;  // 0: server default
  std::vector<std::string> stop;
  std::vector<uint32_t> stop_token_ids;
  bool ignore_eos = false;

  KvCompressionOptions kv_compression;
  // Work stops with DEADLINE_EXCEEDED once passed.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // When the request reached the server (queue and latency figures count from here).
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t kv_prompt_entries = 0;  // per layer and KV head, before compression
  uint32_t kv_kept_entries = 0;    // after compression
  float compression_ratio = 1;
  double queue_ms = 0;
  double time_to_first_token_ms = 0;
  double total_ms = 0;
  double snapkv_ms = -1;  // < 0: no compression ran
};

// Where one request's results go. Called on the engine's thread: must return
// quickly and never call back into the engine.
class ResultSink {
 public:
  virtual ~ResultSink() = default;
  // New tokens and the text they complete (text never splits a UTF-8
  // character and never contains any part of a stop sequence).
  virtual void OnDelta(const std::vector<uint32_t>& token_ids, const std::string& text) = 0;
  // Called exactly once per enqueued request, last. `status` is OK, CANCELLED,
  // DEADLINE_EXCEEDED, UNAVAILABLE (shutdown) or INTERNAL.
  virtual void OnFinish(const Status& status, FinishReason reason, const Usage& usage) = 0;
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
  std::string dtype;
  std::string device;
  KvCompressionOptions default_kv_compression;
  uint32_t max_new_tokens_limit = 0;
  uint32_t max_batch_size = 0;
  uint64_t kv_cache_capacity_tokens = 0;
};

// Batch-level figures for metrics, sampled by the caller at any time.
struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_total = 0;
  double kv_usage_ratio = 0;
};

// Called on the engine thread after each decode step (metrics hooks).
struct EngineObserver {
  std::function<void(int64_t batch_size)> on_decode_step;
  std::function<void(double seconds)> on_inter_token_latency;
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

  StatusOr<std::vector<uint32_t>> Tokenize(std::string_view text, bool add_special_tokens) const;

  EngineStats stats() const;
  void SetObserver(EngineObserver observer);

  // Finishes every queued and running request with UNAVAILABLE and stops the
  // thread. Idempotent; the destructor calls it. (Draining — letting running
  // requests complete first — is the server's job: it stops enqueueing and
  // waits for its calls before calling this.)
  void Shutdown();

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace snapserve::engine
