// The OTLP/JSON encoding (server/tracing/otlp_json.h) and the span tree of
// one request (server/tracing/request_spans.h). The encoding's rules come
// from the OTLP specification ("JSON Protobuf Encoding"): proto3 JSON field
// names, 64-bit integers as decimal strings, enums as integers, and trace and
// span ids as lowercase hex. tests/python/test_tracing.py decodes the same
// bytes with the opentelemetry-proto package.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/tracing/otlp_json.h"
#include "server/tracing/request_spans.h"

namespace snapserve::server::tracing {
namespace {

using nlohmann::json;

json Decode(const std::vector<Span>& spans, const std::string& service = "svc") {
  return json::parse(EncodeExportRequest(spans, service));
}

// The attribute `key` of an encoded span or resource.
json Attr(const json& holder, const std::string& key) {
  for (const json& a : holder.at("attributes")) {
    if (a.at("key") == key) return a.at("value");
  }
  return nullptr;
}

Span Sample() {
  Span s;
  s.trace_id =
      ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")->trace_id;
  s.span_id = ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-0123456789abcdef-01")->span_id;
  s.parent_span_id =
      ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")->span_id;
  s.name = "snapserve.generate";
  s.kind = SpanKind::kServer;
  s.start_ns = 1700000000123456789;
  s.end_ns = 1700000001123456789;
  return s;
}

TEST(OtlpJsonTest, WritesTheResourceScopeAndSpanFields) {
  const json r = Decode({Sample()}, "my-service");
  ASSERT_EQ(r.at("resourceSpans").size(), 1u);
  const json& rs = r["resourceSpans"][0];
  EXPECT_EQ(Attr(rs.at("resource"), "service.name"), json({{"stringValue", "my-service"}}));
  ASSERT_EQ(rs.at("scopeSpans").size(), 1u);
  EXPECT_EQ(rs["scopeSpans"][0].at("scope").at("name"), "snapserve");
  const json& span = rs["scopeSpans"][0].at("spans").at(0);
  EXPECT_EQ(span.at("traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(span.at("spanId"), "0123456789abcdef");
  EXPECT_EQ(span.at("parentSpanId"), "00f067aa0ba902b7");
  EXPECT_EQ(span.at("name"), "snapserve.generate");
  EXPECT_EQ(span.at("kind"), 2);  // SPAN_KIND_SERVER
  // 64-bit integers are strings: a JSON number would lose digits in many parsers.
  EXPECT_EQ(span.at("startTimeUnixNano"), "1700000000123456789");
  EXPECT_EQ(span.at("endTimeUnixNano"), "1700000001123456789");
  EXPECT_FALSE(span.contains("status"));  // unset: not an error
}

TEST(OtlpJsonTest, OmitsTheParentOfARootSpan) {
  Span s = Sample();
  s.parent_span_id = {};
  const json span = Decode({s})["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_FALSE(span.contains("parentSpanId"));
}

TEST(OtlpJsonTest, EncodesEachAttributeType) {
  Span s = Sample();
  s.Set("str", std::string("text \"quoted\""));
  s.Set("int", int64_t{-9007199254740993});  // beyond a double's exact range
  s.Set("dbl", 0.25);
  s.Set("nan", std::numeric_limits<double>::quiet_NaN());
  s.Set("yes", true);
  s.Set("list", std::vector<std::string>{"a", "b"});
  const json span = Decode({s})["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(Attr(span, "str"), json({{"stringValue", "text \"quoted\""}}));
  EXPECT_EQ(Attr(span, "int"), json({{"intValue", "-9007199254740993"}}));
  EXPECT_EQ(Attr(span, "dbl"), json({{"doubleValue", 0.25}}));
  EXPECT_EQ(Attr(span, "nan"), json({{"doubleValue", "NaN"}}));
  EXPECT_EQ(Attr(span, "yes"), json({{"boolValue", true}}));
  EXPECT_EQ(Attr(span, "list"),
            json::parse(R"({"arrayValue":{"values":[{"stringValue":"a"},{"stringValue":"b"}]}})"));
}

TEST(OtlpJsonTest, WritesAnErrorStatus) {
  Span s = Sample();
  s.error = true;
  s.error_message = "engine shut down";
  const json span = Decode({s})["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(span.at("status"), json({{"code", 2}, {"message", "engine shut down"}}));
}

TEST(OtlpJsonTest, ReplacesInvalidUtf8InsteadOfThrowing) {
  Span s = Sample();
  s.Set("gen_ai.response.id", std::string("id-\xff\xfe"));
  EXPECT_NO_THROW(Decode({s}));
}

// A request that went through the engine: two prompt chunks, SnapKV, decode.
FinishedRequest Compressed() {
  FinishedRequest r;
  r.trace.trace_id = NewTraceId();
  r.trace.span_id = NewSpanId();
  r.trace.parent_span_id = NewSpanId();
  r.trace.api = "grpc";
  r.trace.operation = "text_completion";
  r.trace.model = "m";
  r.trace.request_id = "req-1";
  r.trace.max_tokens = 8;
  r.trace.temperature = 0.5f;
  r.trace.top_p = 0.9f;
  r.outcome.status = "OK";
  r.outcome.reason = engine::FinishReason::kLength;
  r.outcome.reached_engine = true;
  r.outcome.arrival_ns = 999;
  r.outcome.end_ns = 10'000;
  engine::Usage& u = r.outcome.usage;
  u.prompt_tokens = 600;
  u.cached_prompt_tokens = 0;
  u.completion_tokens = 8;
  u.kv_prompt_entries = 600;
  u.kv_kept_entries = 256;
  u.compression_ratio = 600.f / 256.f;
  u.retained_attention = 0.75;
  u.snapkv_ms = 0.001;  // 1000 ns
  u.kv_method = engine::KvMethod::kSnapKv;
  u.phases = {.arrival_ns = 1000,
              .admitted_ns = 2000,
              .first_token_ns = 6000,
              .end_ns = 9000,
              .prompt_chunks = {{2100, 4000, 512}, {4000, 6000, 88}}};
  return r;
}

const Span* Named(const std::vector<Span>& spans, const std::string& name, int nth = 0) {
  for (const Span& s : spans) {
    if (s.name == name && nth-- == 0) return &s;
  }
  return nullptr;
}

const AttributeValue* Get(const Span& s, const std::string& key) {
  for (const Attribute& a : s.attributes) {
    if (a.key == key) return &a.value;
  }
  return nullptr;
}

TEST(RequestSpansTest, BuildsTheTreeFromThePhaseTimes) {
  const FinishedRequest r = Compressed();
  const std::vector<Span> spans = BuildRequestSpans(r);
  ASSERT_EQ(spans.size(), CountRequestSpans(r));
  ASSERT_EQ(spans.size(), 6u);  // generate, queue, 2 x prefill, compression, decode
  const Span& root = spans[0];
  EXPECT_EQ(root.name, "snapserve.generate");
  EXPECT_EQ(root.kind, SpanKind::kServer);
  EXPECT_EQ(root.parent_span_id, r.trace.parent_span_id);
  EXPECT_EQ(root.start_ns, 1000);  // the engine's arrival
  EXPECT_EQ(root.end_ns, 10'000);  // the later of the server's and the engine's ends
  for (size_t i = 1; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].trace_id, r.trace.trace_id);
    EXPECT_EQ(spans[i].parent_span_id, r.trace.span_id);
    EXPECT_EQ(spans[i].kind, SpanKind::kInternal);
    EXPECT_NE(spans[i].span_id, root.span_id);
    EXPECT_GE(spans[i].start_ns, root.start_ns);
    EXPECT_LE(spans[i].end_ns, root.end_ns);
  }
  const Span* queue = Named(spans, "snapserve.queue");
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(queue->start_ns, 1000);
  EXPECT_EQ(queue->end_ns, 2000);
  const Span* second = Named(spans, "snapserve.prefill", 1);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->start_ns, 4000);
  EXPECT_EQ(std::get<int64_t>(*Get(*second, "snapserve.prefill.tokens")), 88);
  EXPECT_EQ(std::get<int64_t>(*Get(*second, "snapserve.prefill.chunk")), 1);
  const Span* compression = Named(spans, "snapserve.compression");
  ASSERT_NE(compression, nullptr);
  EXPECT_EQ(compression->start_ns, 5000);  // the last chunk's end less the selection's time
  EXPECT_EQ(compression->end_ns, 6000);
  const Span* decode = Named(spans, "snapserve.decode");
  ASSERT_NE(decode, nullptr);
  EXPECT_EQ(decode->start_ns, 6000);
  EXPECT_EQ(decode->end_ns, 9000);
}

TEST(RequestSpansTest, NamesTheAttributesAsTheGenAiConventions) {
  const std::vector<Span> spans = BuildRequestSpans(Compressed());
  const Span& root = spans[0];
  EXPECT_EQ(std::get<std::string>(*Get(root, "gen_ai.operation.name")), "text_completion");
  EXPECT_EQ(std::get<std::string>(*Get(root, "gen_ai.request.model")), "m");
  EXPECT_EQ(std::get<int64_t>(*Get(root, "gen_ai.request.max_tokens")), 8);
  EXPECT_FLOAT_EQ(std::get<double>(*Get(root, "gen_ai.request.temperature")), 0.5);
  EXPECT_FLOAT_EQ(std::get<double>(*Get(root, "gen_ai.request.top_p")), 0.9);
  EXPECT_EQ(std::get<int64_t>(*Get(root, "gen_ai.usage.input_tokens")), 600);
  EXPECT_EQ(std::get<int64_t>(*Get(root, "gen_ai.usage.output_tokens")), 8);
  EXPECT_EQ(std::get<int64_t>(*Get(root, "gen_ai.usage.cache_read.input_tokens")), 0);
  EXPECT_EQ(std::get<std::vector<std::string>>(*Get(root, "gen_ai.response.finish_reasons")),
            std::vector<std::string>{"length"});
  EXPECT_EQ(std::get<std::string>(*Get(root, "snapserve.kv.method")), "snapkv");
  EXPECT_EQ(std::get<int64_t>(*Get(root, "snapserve.kv.original_entries")), 600);
  EXPECT_EQ(std::get<int64_t>(*Get(root, "snapserve.kv.kept_entries")), 256);
  EXPECT_NEAR(std::get<double>(*Get(root, "snapserve.kv.compression_ratio")), 600.0 / 256.0, 1e-6);
  EXPECT_DOUBLE_EQ(std::get<double>(*Get(root, "snapserve.kv.retained_attention")), 0.75);
}

TEST(RequestSpansTest, ARequestRefusedBeforeTheEngineIsOneSpan) {
  FinishedRequest r = Compressed();
  r.outcome.reached_engine = false;
  r.outcome.usage = {};
  r.outcome.status = "INVALID_ARGUMENT";
  const std::vector<Span> spans = BuildRequestSpans(r);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(CountRequestSpans(r), 1u);
  EXPECT_EQ(spans[0].start_ns, 999);  // the server's own arrival
  EXPECT_EQ(Get(spans[0], "gen_ai.usage.input_tokens"), nullptr);
  EXPECT_FALSE(spans[0].error);  // a client's mistake is not a server error
}

TEST(RequestSpansTest, AnUncompressedPromptHasNoCompressionSpan) {
  FinishedRequest r = Compressed();
  r.outcome.usage.kv_method = engine::KvMethod::kNone;
  r.outcome.usage.retained_attention = -1;
  const std::vector<Span> spans = BuildRequestSpans(r);
  EXPECT_EQ(Named(spans, "snapserve.compression"), nullptr);
  EXPECT_EQ(Get(spans[0], "snapserve.kv.retained_attention"), nullptr);
  EXPECT_EQ(spans.size(), CountRequestSpans(r));
}

}  // namespace
}  // namespace snapserve::server::tracing
