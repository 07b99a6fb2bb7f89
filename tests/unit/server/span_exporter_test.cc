// The span exporter's queue (server/tracing/span_exporter.h): batches reach
// the sender whole, a full queue drops instead of waiting, a failed send is
// counted and backs off, and every span ends counted.
#include "server/tracing/span_exporter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace snapserve::server::tracing {
namespace {

using namespace std::chrono_literals;

FinishedRequest OneSpanRequest() {
  FinishedRequest r;
  r.trace.trace_id = NewTraceId();
  r.trace.span_id = NewSpanId();
  r.outcome.status = "INVALID_ARGUMENT";
  r.outcome.reached_engine = false;  // one span
  return r;
}

struct Counts {
  std::atomic<int64_t> exported{0};
  std::atomic<int64_t> queue_full{0};
  std::atomic<int64_t> export_failed{0};
  ExporterCounters Counters() {
    return {[this](int64_t n) { exported += n; }, [this](int64_t n) { queue_full += n; },
            [this](int64_t n) { export_failed += n; }};
  }
};

// A sender that blocks until released, so the queue's bound can be reached.
struct GatedSender {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::vector<size_t> batch_sizes;
  bool succeed = true;
  SpanExporter::Send Send() {
    return [this](const std::string& body, std::string* error) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return open; });
      const auto json = nlohmann::json::parse(body);
      batch_sizes.push_back(json["resourceSpans"][0]["scopeSpans"][0]["spans"].size());
      if (!succeed) *error = "refused";
      return succeed;
    };
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

TEST(SpanExporterTest, ExportsEverySpanAtShutdown) {
  Counts counts;
  GatedSender sender;
  sender.Open();
  {
    SpanExporter exporter({.max_queue_spans = 100, .max_batch_spans = 10, .schedule_delay = 10s},
                          sender.Send(), counts.Counters());
    for (int i = 0; i < 25; ++i) exporter.Submit(OneSpanRequest());
  }
  EXPECT_EQ(counts.exported.load(), 25);
  EXPECT_EQ(counts.queue_full.load() + counts.export_failed.load(), 0);
  size_t total = 0;
  for (size_t b : sender.batch_sizes) {
    EXPECT_LE(b, 10u);
    total += b;
  }
  EXPECT_EQ(total, 25u);
}

TEST(SpanExporterTest, DropsWhenTheQueueIsFullInsteadOfWaiting) {
  Counts counts;
  GatedSender sender;
  {
    SpanExporter exporter({.max_queue_spans = 8, .max_batch_spans = 4, .schedule_delay = 1ms},
                          sender.Send(), counts.Counters());
    // The sender is stuck, so at most one batch (4) is out and 8 queue; the
    // rest of these return at once, dropped.
    for (int i = 0; i < 100; ++i) exporter.Submit(OneSpanRequest());
    EXPECT_GE(counts.queue_full.load(), 100 - 12);
    sender.Open();
  }
  EXPECT_EQ(counts.exported.load() + counts.queue_full.load(), 100);
}

TEST(SpanExporterTest, CountsAFailedSendAndBacksOff) {
  Counts counts;
  GatedSender sender;
  sender.succeed = false;
  sender.Open();
  {
    SpanExporter exporter({.max_queue_spans = 100,
                           .max_batch_spans = 2,
                           .schedule_delay = 1ms,
                           .initial_backoff = 1h},
                          sender.Send(), counts.Counters());
    exporter.Submit(OneSpanRequest());
    exporter.Submit(OneSpanRequest());
    // The first batch fails; what follows waits out the backoff, which
    // outlasts the exporter, so it is dropped at shutdown without another send.
    while (counts.export_failed.load() < 1) std::this_thread::sleep_for(1ms);
    for (int i = 0; i < 5; ++i) exporter.Submit(OneSpanRequest());
  }
  EXPECT_EQ(sender.batch_sizes.size(), 1u);
  EXPECT_EQ(counts.exported.load(), 0);
  EXPECT_EQ(counts.export_failed.load(), 7);
}

}  // namespace
}  // namespace snapserve::server::tracing
