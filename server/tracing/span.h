// A finished span as the OTLP trace data model has it
// (opentelemetry/proto/trace/v1/trace.proto): ids, name, kind, start and end
// in Unix-epoch nanoseconds, attributes, and an error status.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "server/tracing/trace_context.h"

namespace snapserve::server::tracing {

using AttributeValue = std::variant<std::string, int64_t, double, bool, std::vector<std::string>>;

struct Attribute {
  std::string key;
  AttributeValue value;
};

// The values of OTLP's Span.SpanKind.
enum class SpanKind : int { kInternal = 1, kServer = 2 };

struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_span_id{};  // all zero: a root span
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::vector<Attribute> attributes;
  bool error = false;  // OTLP's STATUS_CODE_ERROR; otherwise the status is unset
  std::string error_message;

  void Set(std::string key, AttributeValue value) {
    attributes.push_back({std::move(key), std::move(value)});
  }
};

}  // namespace snapserve::server::tracing
