// The server's tracing (docs/metrics.md, "Traces"), on when --otlp-endpoint
// is set. A front door calls Begin when a generation request arrives, with
// the client's `traceparent` (gRPC metadata or HTTP header), and End when the
// call ends (server/generate_calls.h, ReportCall), possibly on the engine's
// thread: End only queues, the exporter's thread does the rest.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "server/tracing/request_spans.h"
#include "server/tracing/span_exporter.h"

namespace prometheus {
class Registry;
}

namespace snapserve::server::tracing {

struct TracerOptions {
  std::string endpoint;  // the collector's base URL, http://host:4318
  std::string service_name = "snapserve";
};

class Tracer {
 public:
  // Adds snapserve_trace_spans_exported_total and
  // snapserve_trace_spans_dropped_total{reason} to `registry` (may be null).
  Tracer(const TracerOptions& options, prometheus::Registry* registry);
  ~Tracer();

  // A new request: continues the trace of a valid `traceparent`, else starts
  // one; its snapserve.generate span gets a new id.
  RequestTrace Begin(std::string_view traceparent, std::string api, std::string operation,
                     std::string model, std::string request_id);
  // Queues the request's spans for export; nothing when not sampled.
  void End(const RequestTrace& trace, RequestOutcome outcome);

 private:
  std::unique_ptr<SpanExporter> exporter_;
};

}  // namespace snapserve::server::tracing
