// The reactors of the two Generate RPCs (gRPC callback API): each call turns
// its request into an engine request, enqueues it with a ResultSink that
// feeds the reactor, forwards client cancellation to the engine, and when the
// call ends records metrics and writes the `inference_complete` log line.
#pragma once

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "snapserve/v1/generation.grpc.pb.h"

namespace snapserve::server {

class InFlight;
class Metrics;

struct CallContext {
  engine::Engine* engine = nullptr;
  Metrics* metrics = nullptr;
  InFlight* in_flight = nullptr;
};

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
