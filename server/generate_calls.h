// The reactors of the two Generate RPCs (gRPC callback API): each call turns
// its request into an engine request, enqueues it with a ResultSink that
// feeds the reactor, forwards client cancellation to the engine, and when the
// call ends records metrics and writes the `inference_complete` log line.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "server/tracing/request_spans.h"
#include "snapserve/v1/generation.grpc.pb.h"

namespace snapserve::server {

class InFlight;
class Metrics;
namespace tracing {
class Tracer;
}

struct CallContext {
  engine::Engine* engine = nullptr;
  Metrics* metrics = nullptr;
  InFlight* in_flight = nullptr;
  tracing::Tracer* tracer = nullptr;  // null: tracing is off
};

// The checks made before the engine's own, for every front door (gRPC and
// HTTP): enum values the engine's structs cannot carry, and input text too
// long to ever fit the context, refused before the engine tokenizes it
// (engine/request_validation.h).
Status CheckRequest(const engine::Engine& engine, const snapserve::v1::GenerateRequest& request,
                    const engine::GenerationRequest& converted);

// What every generation call reports when it ends, whichever front door it
// came through: metrics, one `inference_complete` JSON line and, when
// `trace` is given, the request's spans (queued for export, never sent here). `status` is
// what the client got (as a gRPC code); `engine_status` the engine's own,
// whose message the log keeps when the client got only a summary (INTERNAL,
// ToGrpc).
void ReportCall(Metrics* metrics, const std::string& request_id, const grpc::Status& status,
                const Status& engine_status, engine::FinishReason reason,
                const engine::Usage& usage, bool reached_engine,
                std::chrono::steady_clock::time_point arrival,
                const tracing::RequestTrace* trace = nullptr);

// The request's trace when tracing is on: continues the client's
// `traceparent` (gRPC metadata or HTTP header; "" when absent) and records
// the request's generation parameters. nullopt when `tracer` is null.
std::optional<tracing::RequestTrace> BeginTrace(tracing::Tracer* tracer,
                                                std::string_view traceparent, const char* api,
                                                const engine::Engine& engine,
                                                const snapserve::v1::GenerateRequest& request,
                                                const engine::GenerationRequest& converted);

// Both start the call and return the reactor gRPC drives; it deletes itself
// in OnDone.
grpc::ServerUnaryReactor* StartGenerateCall(const CallContext& ctx,
                                            grpc::CallbackServerContext* server_ctx,
                                            const snapserve::v1::GenerateRequest* request,
                                            snapserve::v1::GenerateResponse* response);
grpc::ServerWriteReactor<snapserve::v1::GenerateStreamResponse>* StartGenerateStreamCall(
    const CallContext& ctx, grpc::CallbackServerContext* server_ctx,
    const snapserve::v1::GenerateRequest* request);

}  // namespace snapserve::server
