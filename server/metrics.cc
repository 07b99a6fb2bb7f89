#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>

#include "engine/common/status.h"
#include "engine/engine.h"
#include "server/metrics_http.h"

namespace snapserve::server {

using prometheus::Histogram;

namespace {
// Latency buckets from 1 ms to 2 min: covers a decode step and a long prefill.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}
}  // namespace

struct Metrics::Families {
  explicit Families(prometheus::Registry& r)
      : requests(prometheus::BuildCounter()
                     .Name("snapserve_requests_total")
                     .Help("Finished Generate calls by gRPC status code")
                     .Register(r)),
        request_duration(prometheus::BuildHistogram()
                             .Name("snapserve_request_duration_seconds")
                             .Help("Time from arrival to the last response of a Generate call")
                             .Register(r)
                             .Add({}, LatencyBuckets())),
        queue_duration(prometheus::BuildHistogram()
                           .Name("snapserve_queue_duration_seconds")
                           .Help("Time a request waited for admission")
                           .Register(r)
                           .Add({}, LatencyBuckets())),
        ttft(prometheus::BuildHistogram()
                 .Name("snapserve_time_to_first_token_seconds")
                 .Help("Time from arrival to the first generated token")
                 .Register(r)
                 .Add({}, LatencyBuckets())),
        inter_token(prometheus::BuildHistogram()
                        .Name("snapserve_inter_token_latency_seconds")
                        .Help("Time between consecutive tokens of one request")
                        .Register(r)
                        .Add({}, LatencyBuckets())),
        prompt_tokens(prometheus::BuildCounter()
                          .Name("snapserve_prompt_tokens_total")
                          .Help("Prompt tokens of finished requests")
                          .Register(r)
                          .Add({})),
        prefix_hits(prometheus::BuildCounter()
                        .Name("snapserve_prefix_cache_hits_total")
                        .Help("Finished requests whose prompt started from a cached prefix")
                        .Register(r)
                        .Add({})),
        prefix_hit_tokens(prometheus::BuildCounter()
                              .Name("snapserve_prefix_cache_hit_tokens_total")
                              .Help("Prompt tokens of finished requests served by the prefix cache")
                              .Register(r)
                              .Add({})),
        document_hits(prometheus::BuildCounter()
                          .Name("snapserve_document_cache_hits_total")
                          .Help("Finished requests whose document came from the document cache")
                          .Register(r)
                          .Add({})),
        document_hit_tokens(prometheus::BuildCounter()
                                .Name("snapserve_document_cache_hit_tokens_total")
                                .Help("Document tokens of finished requests whose prefill the "
                                      "document cache saved")
                                .Register(r)
                                .Add({})),
        prefix_usage(prometheus::BuildGauge()
                         .Name("snapserve_prefix_cache_usage_ratio")
                         .Help("Share of the prefix cache's memory holding cached chunks")
                         .Register(r)
                         .Add({})),
        kv_store_reads(prometheus::BuildCounter()
                           .Name("snapserve_kv_store_reads_total")
                           .Help("Prefix chunks looked up in the shared KV store, by result "
                                 "(hit: read and used; miss: not there)")
                           .Register(r)),
        kv_store_writes(prometheus::BuildCounter()
                            .Name("snapserve_kv_store_writes_total")
                            .Help("Prefix chunks computed here and written to the shared KV store")
                            .Register(r)
                            .Add({})),
        kv_store_errors(prometheus::BuildCounter()
                            .Name("snapserve_kv_store_errors_total")
                            .Help("Shared KV store errors and refused entries, by kind")
                            .Register(r)),
        kv_store_bytes(prometheus::BuildCounter()
                           .Name("snapserve_kv_store_bytes_total")
                           .Help("Bytes of chunk entries moved to (out) and from (in) the shared "
                                 "KV store")
                           .Register(r)),
        generated_tokens(prometheus::BuildCounter()
                             .Name("snapserve_generated_tokens_total")
                             .Help("Generated tokens of finished requests")
                             .Register(r)
                             .Add({})),
        compression_ratio(
            prometheus::BuildHistogram()
                .Name("snapserve_kv_compression_ratio")
                .Help("Prompt KV entries before / after compression, per request (1: none)")
                .Register(r)
                .Add({}, Histogram::BucketBoundaries{1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64})),
        kv_before(prometheus::BuildCounter()
                      .Name("snapserve_kv_entries_before_total")
                      .Help("Prompt KV entries per layer and KV head before compression")
                      .Register(r)
                      .Add({})),
        kv_after(prometheus::BuildCounter()
                     .Name("snapserve_kv_entries_after_total")
                     .Help("Prompt KV entries per layer and KV head after compression")
                     .Register(r)
                     .Add({})),
        snapkv_duration(prometheus::BuildHistogram()
                            .Name("snapserve_snapkv_duration_seconds")
                            .Help("SnapKV selection time per request, all layers")
                            .Register(r)
                            .Add({}, LatencyBuckets())),
        retained_attention(
            prometheus::BuildHistogram()
                .Name("snapserve_kv_retained_attention_ratio")
                .Help("Per compressed request: share of the observation window's attention on "
                      "the prompt prefix that the kept entries carry, mean over layers and KV "
                      "heads")
                .Register(r)
                .Add({}, Histogram::BucketBoundaries{0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1})),
        kv_usage(prometheus::BuildGauge()
                     .Name("snapserve_kv_cache_usage_ratio")
                     .Help("Share of KV cache blocks in use")
                     .Register(r)
                     .Add({})),
        kv_free(prometheus::BuildGauge()
                    .Name("snapserve_kv_cache_blocks_free")
                    .Help("Free KV cache blocks")
                    .Register(r)
                    .Add({})),
        running(prometheus::BuildGauge()
                    .Name("snapserve_requests_running")
                    .Help("Requests admitted and generating")
                    .Register(r)
                    .Add({})),
        waiting(prometheus::BuildGauge()
                    .Name("snapserve_requests_waiting")
                    .Help("Requests waiting for admission")
                    .Register(r)
                    .Add({})),
        batch_size(prometheus::BuildHistogram()
                       .Name("snapserve_batch_size")
                       .Help("Sequences per decode step")
                       .Register(r)
                       .Add({}, Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})) {}

  prometheus::Family<prometheus::Counter>& requests;
  Histogram& request_duration;
  Histogram& queue_duration;
  Histogram& ttft;
  Histogram& inter_token;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& prefix_hits;
  prometheus::Counter& prefix_hit_tokens;
  prometheus::Counter& document_hits;
  prometheus::Counter& document_hit_tokens;
  prometheus::Gauge& prefix_usage;
  prometheus::Family<prometheus::Counter>& kv_store_reads;
  prometheus::Counter& kv_store_writes;
  prometheus::Family<prometheus::Counter>& kv_store_errors;
  prometheus::Family<prometheus::Counter>& kv_store_bytes;
  prometheus::Counter& generated_tokens;
  Histogram& compression_ratio;
  prometheus::Counter& kv_before;
  prometheus::Counter& kv_after;
  Histogram& snapkv_duration;
  Histogram& retained_attention;
  prometheus::Gauge& kv_usage;
  prometheus::Gauge& kv_free;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  Histogram& batch_size;
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      f_(std::make_unique<Families>(*registry_)) {
  // Series exist from the start, at 0, so rate() and alerts see the first
  // error instead of a series that appears out of nowhere.
  for (StatusCode code :
       {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kResourceExhausted,
        StatusCode::kDeadlineExceeded, StatusCode::kCancelled, StatusCode::kUnavailable,
        StatusCode::kInternal}) {
    f_->requests.Add({{"status", status_code_name(code)}});
  }
  for (const char* result : {"hit", "miss"}) f_->kv_store_reads.Add({{"result", result}});
  for (const char* direction : {"in", "out"}) f_->kv_store_bytes.Add({{"direction", direction}});
  for (const std::string& kind : engine::KvStoreErrorKinds()) {
    f_->kv_store_errors.Add({{"kind", kind}});
  }
}

Metrics::~Metrics() = default;

std::string Metrics::Serve(const std::string& host, int port) {
  http_ = std::make_unique<MetricsHttpServer>([this] { return Render(); });
  return http_->Start(host, port);
}

std::string Metrics::address() const { return http_ ? http_->address() : ""; }

std::string Metrics::Render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void Metrics::RecordRequest(const RequestRecord& r) {
  f_->requests.Add({{"status", r.status}}).Increment();
  f_->request_duration.Observe(r.total_s);
  if (r.queue_s >= 0) f_->queue_duration.Observe(r.queue_s);
  if (r.ttft_s >= 0) f_->ttft.Observe(r.ttft_s);
  f_->prompt_tokens.Increment(static_cast<double>(r.prompt_tokens));
  f_->generated_tokens.Increment(static_cast<double>(r.completion_tokens));
  if (r.document_cache_hit) {
    f_->document_hits.Increment();
    f_->document_hit_tokens.Increment(static_cast<double>(r.cached_prompt_tokens));
  } else if (r.cached_prompt_tokens > 0) {
    f_->prefix_hits.Increment();
    f_->prefix_hit_tokens.Increment(static_cast<double>(r.cached_prompt_tokens));
  }
  if (r.kv_entries_after > 0) {
    f_->compression_ratio.Observe(static_cast<double>(r.kv_entries_before) /
                                  static_cast<double>(r.kv_entries_after));
    f_->kv_before.Increment(static_cast<double>(r.kv_entries_before));
    f_->kv_after.Increment(static_cast<double>(r.kv_entries_after));
  }
  if (r.snapkv_s >= 0) f_->snapkv_duration.Observe(r.snapkv_s);
  if (r.retained_attention >= 0) f_->retained_attention.Observe(r.retained_attention);
}

void Metrics::ObserveInterTokenLatency(double seconds) { f_->inter_token.Observe(seconds); }
void Metrics::ObserveBatchSize(int64_t sequences) {
  f_->batch_size.Observe(static_cast<double>(sequences));
}
void Metrics::SetKvCache(double usage_ratio, int64_t free_blocks) {
  f_->kv_usage.Set(usage_ratio);
  f_->kv_free.Set(static_cast<double>(free_blocks));
}
void Metrics::SetPrefixCache(double usage_ratio) { f_->prefix_usage.Set(usage_ratio); }
void Metrics::SetKvStoreTotals(const KvStoreTotals& t) {
  KvStoreTotals& seen = kv_store_seen_;
  auto advance = [](prometheus::Counter& counter, int64_t total, int64_t& seen_total) {
    if (total > seen_total) counter.Increment(static_cast<double>(total - seen_total));
    seen_total = std::max(seen_total, total);
  };
  advance(f_->kv_store_reads.Add({{"result", "hit"}}), t.read_hits, seen.read_hits);
  advance(f_->kv_store_reads.Add({{"result", "miss"}}), t.read_misses, seen.read_misses);
  advance(f_->kv_store_writes, t.writes, seen.writes);
  advance(f_->kv_store_bytes.Add({{"direction", "in"}}), t.bytes_read, seen.bytes_read);
  advance(f_->kv_store_bytes.Add({{"direction", "out"}}), t.bytes_written, seen.bytes_written);
  seen.errors.resize(t.errors.size());
  for (size_t i = 0; i < t.errors.size(); ++i) {
    advance(f_->kv_store_errors.Add({{"kind", t.errors[i].first}}), t.errors[i].second,
            seen.errors[i].second);
  }
}

void Metrics::SetRequests(int64_t running, int64_t waiting) {
  f_->running.Set(static_cast<double>(running));
  f_->waiting.Set(static_cast<double>(waiting));
}

}  // namespace snapserve::server
