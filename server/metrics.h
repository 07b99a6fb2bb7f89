// Prometheus metrics (names and labels: docs/metrics.md), kept in a
// prometheus-cpp registry and served on their own port by the project's own
// HTTP server (metrics_http.h), not by prometheus-cpp's exposer. The server
// records per-request figures when a call ends; the engine's batch-level
// figures (KV usage, queue, batch size, inter-token latency) reach it through
// the setters below. Never touches tensors or gRPC types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace snapserve::server {

class MetricsHttpServer;

// What one finished request contributes to the metrics.
struct RequestRecord {
  std::string status;  // gRPC code name, e.g. "OK", "INVALID_ARGUMENT"
  double total_s = 0;
  double queue_s = -1;  // < 0: never queued (rejected before the engine)
  double ttft_s = -1;   // < 0: no token produced
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of prompt_tokens, served by the prefix or document cache
  bool document_cache_hit = false;   // by the document cache
  int64_t completion_tokens = 0;
  int64_t kv_entries_before = 0;  // per layer and KV head
  int64_t kv_entries_after = 0;
  double snapkv_s = -1;  // < 0: no compression ran
  // Usage::retained_attention: < 0 when no compression ran or it was not measured
  double retained_attention = -1;
};

// The shared KV tier's totals since start (engine::KvStoreStats).
struct KvStoreTotals {
  int64_t read_hits = 0;
  int64_t read_misses = 0;
  int64_t writes = 0;
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  std::vector<std::pair<std::string, int64_t>> errors;  // by kind
};

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Starts serving /metrics on host:port. Returns "" or an error message.
  std::string Serve(const std::string& host, int port);
  // The address /metrics is bound to ("127.0.0.1:9464", "[::1]:9464"); "" before Serve.
  std::string address() const;
  // The exposition text of every metric (what a scrape returns).
  std::string Render() const;

  void RecordRequest(const RequestRecord& record);
  void ObserveInterTokenLatency(double seconds);
  void ObserveBatchSize(int64_t sequences);
  void SetKvCache(double usage_ratio, int64_t free_blocks);
  void SetPrefixCache(double usage_ratio);
  // Advances the kv_store counters to `totals` (sampled, like the gauges).
  void SetKvStoreTotals(const KvStoreTotals& totals);
  void SetRequests(int64_t running, int64_t waiting);

  // For metrics kept by another part of the server (the tracer's span
  // counters, server/tracing/tracer.h); rendered with the rest.
  prometheus::Registry* registry() const { return registry_.get(); }

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  std::unique_ptr<MetricsHttpServer> http_;
  KvStoreTotals kv_store_seen_;  // what the counters hold already
};

}  // namespace snapserve::server
