#include "server/tracing/span_exporter.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "server/tracing/otlp_json.h"

namespace snapserve::server::tracing {

using Clock = std::chrono::steady_clock;

SpanExporter::SpanExporter(ExporterOptions options, Send send, ExporterCounters counters,
                           std::function<void(const std::string&)> on_error)
    : options_(std::move(options)),
      send_(std::move(send)),
      counters_(std::move(counters)),
      on_error_(std::move(on_error)),
      thread_([this] { Loop(); }) {}

SpanExporter::~SpanExporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void SpanExporter::Submit(FinishedRequest request) {
  const size_t spans = CountRequestSpans(request);
  bool full_batch = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queued_spans_ + spans > options_.max_queue_spans) {
      if (counters_.dropped_queue_full) counters_.dropped_queue_full(static_cast<int64_t>(spans));
      return;
    }
    queue_.push_back(std::move(request));
    queued_spans_ += spans;
    full_batch = queued_spans_ >= options_.max_batch_spans;
  }
  if (full_batch) wake_.notify_one();
}

void SpanExporter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Wait for a full batch, the schedule delay, or the end of a backoff.
    const auto deadline = std::max(Clock::now() + options_.schedule_delay, retry_at_);
    wake_.wait_until(lock, deadline, [&] {
      return stopping_ || (queued_spans_ >= options_.max_batch_spans && Clock::now() >= retry_at_);
    });
    const bool backing_off = Clock::now() < retry_at_;
    if (stopping_ && (queue_.empty() || backing_off)) break;
    if (queue_.empty() || backing_off) continue;
    std::deque<FinishedRequest> batch;
    size_t spans = 0;
    do {
      spans += CountRequestSpans(queue_.front());
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    } while (!queue_.empty() &&
             spans + CountRequestSpans(queue_.front()) <= options_.max_batch_spans);
    queued_spans_ -= spans;
    lock.unlock();
    Export(std::move(batch), spans);
    lock.lock();
  }
  // Stopping while backing off: what is left never reaches the collector.
  if (queued_spans_ > 0 && counters_.dropped_export_failed) {
    counters_.dropped_export_failed(static_cast<int64_t>(queued_spans_));
  }
  queue_.clear();
  queued_spans_ = 0;
}

void SpanExporter::Export(std::deque<FinishedRequest> batch, size_t spans) {
  std::vector<Span> all;
  all.reserve(spans);
  for (const FinishedRequest& r : batch) {
    std::vector<Span> one = BuildRequestSpans(r);
    std::move(one.begin(), one.end(), std::back_inserter(all));
  }
  std::string error;
  if (send_(EncodeExportRequest(all, options_.service_name), &error)) {
    backoff_ = std::chrono::milliseconds(0);
    retry_at_ = {};
    if (counters_.exported) counters_.exported(static_cast<int64_t>(all.size()));
    return;
  }
  backoff_ = backoff_.count() == 0 ? options_.initial_backoff
                                   : std::min(backoff_ * 2, options_.max_backoff);
  retry_at_ = Clock::now() + backoff_;
  if (counters_.dropped_export_failed)
    counters_.dropped_export_failed(static_cast<int64_t>(all.size()));
  if (on_error_) on_error_(error);
}

}  // namespace snapserve::server::tracing
