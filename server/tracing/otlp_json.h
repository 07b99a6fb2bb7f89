// The OTLP/JSON encoding of an ExportTraceServiceRequest
// (opentelemetry/proto/collector/trace/v1/trace_service.proto), what an
// OTLP/HTTP receiver takes at POST /v1/traces with Content-Type
// application/json: proto3's JSON mapping (lowerCamelCase names, 64-bit
// integers as strings, enums as numbers) except that trace and span ids are
// lowercase hex rather than base64, as the OTLP specification requires.
#pragma once

#include <string>
#include <vector>

#include "server/tracing/span.h"

namespace snapserve::server::tracing {

// One resource (service.name = `service_name`) with one instrumentation
// scope ("snapserve") holding `spans`.
std::string EncodeExportRequest(const std::vector<Span>& spans, const std::string& service_name);

}  // namespace snapserve::server::tracing
