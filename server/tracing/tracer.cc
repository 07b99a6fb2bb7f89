#include "server/tracing/tracer.h"

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "server/logging.h"
#include "server/tracing/otlp_http_client.h"

namespace snapserve::server::tracing {

Tracer::Tracer(const TracerOptions& options, prometheus::Registry* registry) {
  ExporterCounters counters;
  if (registry != nullptr) {
    auto& exported = prometheus::BuildCounter()
                         .Name("snapserve_trace_spans_exported_total")
                         .Help("Trace spans the OTLP collector accepted")
                         .Register(*registry)
                         .Add({});
    auto& dropped = prometheus::BuildCounter()
                        .Name("snapserve_trace_spans_dropped_total")
                        .Help(
                            "Trace spans never exported, by reason (queue_full: the export "
                            "queue was full; export_failed: the collector did not take them)")
                        .Register(*registry);
    auto& queue_full = dropped.Add({{"reason", "queue_full"}});
    auto& export_failed = dropped.Add({{"reason", "export_failed"}});
    counters.exported = [&exported](int64_t n) { exported.Increment(static_cast<double>(n)); };
    counters.dropped_queue_full = [&queue_full](int64_t n) {
      queue_full.Increment(static_cast<double>(n));
    };
    counters.dropped_export_failed = [&export_failed](int64_t n) {
      export_failed.Increment(static_cast<double>(n));
    };
  }
  auto client = std::make_shared<OtlpHttpClient>(OtlpHttpOptions{.endpoint = options.endpoint});
  ExporterOptions exporter_options;
  exporter_options.service_name = options.service_name;
  exporter_ = std::make_unique<SpanExporter>(
      exporter_options,
      [client](const std::string& body, std::string* error) { return client->Post(body, error); },
      std::move(counters),
      [url = TracesUrl(options.endpoint)](const std::string& error) {
        LogEvent("warn", "trace_export_failed", {{"url", url}, {"error", error}});
      });
}

Tracer::~Tracer() = default;

RequestTrace Tracer::Begin(std::string_view traceparent, std::string api, std::string operation,
                           std::string model, std::string request_id) {
  RequestTrace t;
  t.tracer = this;
  if (const std::optional<TraceParent> parent = ParseTraceParent(traceparent)) {
    t.trace_id = parent->trace_id;
    t.parent_span_id = parent->span_id;
    t.sampled = parent->sampled();
  } else {
    t.trace_id = NewTraceId();
  }
  t.span_id = NewSpanId();
  t.api = std::move(api);
  t.operation = std::move(operation);
  t.model = std::move(model);
  t.request_id = std::move(request_id);
  return t;
}

void Tracer::End(const RequestTrace& trace, RequestOutcome outcome) {
  if (!trace.sampled) return;
  exporter_->Submit({trace, std::move(outcome)});
}

}  // namespace snapserve::server::tracing
