// Batches finished requests' spans and sends them on its own thread
// (docs/metrics.md, "Traces"). Submit never waits on I/O: it takes a short
// lock and queues the request, or drops it when the queue already holds
// max_queue_spans spans. The thread builds the spans, encodes them as
// OTLP/JSON and sends a batch when max_batch_spans are queued or
// schedule_delay has passed. A failed send drops its batch and backs off
// (doubling up to max_backoff), so a dead collector costs one bounded
// attempt per backoff period; what arrives meanwhile queues up to the bound
// and is dropped past it. Every span ends counted: exported, or dropped with
// a reason.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "server/tracing/request_spans.h"

namespace snapserve::server::tracing {

struct ExporterOptions {
  std::string service_name = "snapserve";
  size_t max_queue_spans = 2048;
  size_t max_batch_spans = 512;
  std::chrono::milliseconds schedule_delay{500};
  std::chrono::milliseconds initial_backoff{1000};
  std::chrono::milliseconds max_backoff{30000};
};

// Where the counts go (Prometheus counters in the server).
struct ExporterCounters {
  std::function<void(int64_t spans)> exported;
  std::function<void(int64_t spans)> dropped_queue_full;
  std::function<void(int64_t spans)> dropped_export_failed;
};

class SpanExporter {
 public:
  // Sends one OTLP/JSON body; true when the collector took it, else sets `error`.
  using Send = std::function<bool(const std::string& body, std::string* error)>;
  // `on_error` (may be empty) hears each failed send, on the exporter thread.
  SpanExporter(ExporterOptions options, Send send, ExporterCounters counters,
               std::function<void(const std::string&)> on_error = {});
  // Sends what is queued (one attempt, unless backing off) and stops.
  ~SpanExporter();
  SpanExporter(const SpanExporter&) = delete;
  SpanExporter& operator=(const SpanExporter&) = delete;

  void Submit(FinishedRequest request);

 private:
  void Loop();
  // Sends one batch taken from the queue; called without the lock.
  void Export(std::deque<FinishedRequest> batch, size_t spans);

  const ExporterOptions options_;
  const Send send_;
  const ExporterCounters counters_;
  const std::function<void(const std::string&)> on_error_;

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<FinishedRequest> queue_;
  size_t queued_spans_ = 0;
  bool stopping_ = false;

  // Exporter thread only.
  std::chrono::steady_clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};

  std::thread thread_;
};

}  // namespace snapserve::server::tracing
