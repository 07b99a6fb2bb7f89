#include "server/tracing/otlp_json.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace snapserve::server::tracing {
namespace {

using nlohmann::json;

json StringValue(const std::string& s) { return {{"stringValue", s}}; }

// OTLP's AnyValue. A double that JSON cannot carry as a number (NaN, an
// infinity) is written as proto3's JSON mapping writes it, a string.
json AnyValue(const AttributeValue& value) {
  struct Visit {
    json operator()(const std::string& s) const { return StringValue(s); }
    json operator()(int64_t i) const { return {{"intValue", std::to_string(i)}}; }
    json operator()(double d) const {
      if (std::isnan(d)) return {{"doubleValue", "NaN"}};
      if (std::isinf(d)) return {{"doubleValue", d > 0 ? "Infinity" : "-Infinity"}};
      return {{"doubleValue", d}};
    }
    json operator()(bool b) const { return {{"boolValue", b}}; }
    json operator()(const std::vector<std::string>& list) const {
      json values = json::array();
      for (const std::string& s : list) values.push_back(StringValue(s));
      return {{"arrayValue", {{"values", std::move(values)}}}};
    }
  };
  return std::visit(Visit{}, value);
}

json Attributes(const std::vector<Attribute>& attributes) {
  json out = json::array();
  for (const Attribute& a : attributes)
    out.push_back({{"key", a.key}, {"value", AnyValue(a.value)}});
  return out;
}

json SpanJson(const Span& s) {
  json out = {{"traceId", ToHex(s.trace_id)},
              {"spanId", ToHex(s.span_id)},
              {"name", s.name},
              {"kind", static_cast<int>(s.kind)},
              {"startTimeUnixNano", std::to_string(s.start_ns)},
              {"endTimeUnixNano", std::to_string(s.end_ns)},
              {"attributes", Attributes(s.attributes)}};
  if (!IsZero(s.parent_span_id)) out["parentSpanId"] = ToHex(s.parent_span_id);
  if (s.error) {
    constexpr int kStatusCodeError = 2;
    out["status"] = {{"code", kStatusCodeError}, {"message", s.error_message}};
  }
  return out;
}

}  // namespace

std::string EncodeExportRequest(const std::vector<Span>& spans, const std::string& service_name) {
  json list = json::array();
  for (const Span& s : spans) list.push_back(SpanJson(s));
  const json request = {
      {"resourceSpans",
       json::array(
           {{{"resource",
              {{"attributes", Attributes({{"service.name", service_name},
                                          {"telemetry.sdk.language", std::string("cpp")},
                                          {"telemetry.sdk.name", std::string("snapserve")}})}}},
             {"scopeSpans",
              json::array({{{"scope", {{"name", "snapserve"}}}, {"spans", std::move(list)}}})}}})}};
  // Invalid UTF-8 in a string (an id a client chose) is replaced, never thrown on.
  return request.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace snapserve::server::tracing
