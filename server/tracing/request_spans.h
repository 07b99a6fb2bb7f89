// One generation request's spans (docs/metrics.md, "Traces"): the server span
// `snapserve.generate` and its children `snapserve.queue`, one
// `snapserve.prefill` per prompt chunk, `snapserve.compression` and
// `snapserve.decode`, built after the request ended from the phase times the
// engine returned in its Usage (engine::PhaseTimes), never while it ran.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_types.h"
#include "engine/result_sink.h"
#include "server/tracing/span.h"
#include "server/tracing/trace_context.h"

namespace snapserve::server::tracing {

class Tracer;

// What a front door knows of a request's trace from its arrival on.
struct RequestTrace {
  Tracer* tracer = nullptr;
  TraceId trace_id{};
  SpanId span_id{};         // the request's snapserve.generate span
  SpanId parent_span_id{};  // the client's span from its traceparent; zero when none
  bool sampled = true;      // false: the client's traceparent says it does not record
  std::string api;          // "grpc" or "http"
  std::string operation;    // gen_ai.operation.name: "text_completion" or "chat"
  std::string model;
  std::string request_id;
  uint32_t max_tokens = 0;  // 0: the request left it to the server
  float temperature = 0;
  float top_p = 0;  // 0 or 1: off
};

// How the request ended, as the client saw it.
struct RequestOutcome {
  std::string status;  // gRPC code name: "OK", "INVALID_ARGUMENT", ...
  bool server_error = false;
  std::string error_message;
  engine::FinishReason reason = engine::FinishReason::kLength;
  bool reached_engine = false;  // false: refused before the engine, usage is empty
  int64_t arrival_ns = 0;       // the server's own view, used when the engine never saw it
  int64_t end_ns = 0;
  engine::Usage usage;
};

struct FinishedRequest {
  RequestTrace trace;
  RequestOutcome outcome;
};

// How many spans BuildRequestSpans makes, known before it runs (the
// exporter's queue is bounded in spans).
size_t CountRequestSpans(const FinishedRequest& request);

// The root span first; the children's ids are new random ones.
std::vector<Span> BuildRequestSpans(const FinishedRequest& request);

}  // namespace snapserve::server::tracing
