// W3C Trace Context (https://www.w3.org/TR/trace-context/): the
// `traceparent` a client sends in gRPC metadata or an HTTP header, and the
// ids of the spans the server makes. A request continues the client's trace
// when its traceparent is valid and starts a new one otherwise.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace snapserve::server::tracing {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

struct TraceParent {
  TraceId trace_id{};
  SpanId span_id{};   // the caller's span: the parent of ours
  uint8_t flags = 0;  // bit 0: the caller sampled (records) this trace
  bool sampled() const { return (flags & 1) != 0; }
};

// Parses `version-traceid-spanid-flags` as the specification's processing
// model says: lowercase hex only, version ff and all-zero ids invalid, and
// version 00 exactly 55 characters, while a later version may append fields
// after a '-'. Leading and trailing spaces and tabs are ignored. nullopt: invalid.
std::optional<TraceParent> ParseTraceParent(std::string_view header);

// Fresh ids from the kernel's random source (getrandom), never all zero.
TraceId NewTraceId();
SpanId NewSpanId();

bool IsZero(const TraceId& id);
bool IsZero(const SpanId& id);

// Lowercase hex, as traceparent and OTLP/JSON write ids.
std::string ToHex(const TraceId& id);
std::string ToHex(const SpanId& id);

}  // namespace snapserve::server::tracing
