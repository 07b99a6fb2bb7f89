// The snapserve.v1.Generation service on the gRPC callback API: one small
// reactor per streaming call, no completion-queue state machines. It tracks
// the calls in flight so that SIGTERM can drain them, and refuses new calls
// with UNAVAILABLE while the model loads or the server drains. A request whose
// bytes do not parse as its message gets INTERNAL with a message naming the
// message type (gRPC's code for "error parsing request proto"), not the
// callback API's UNIMPLEMENTED with no message.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "snapserve/v1/generation.grpc.pb.h"

namespace snapserve::server {

class BearerAuth;
class Metrics;
namespace tracing {
class Tracer;
}

// Counts calls in flight; Drain() waits for them to end.
class InFlight {
 public:
  void Begin();
  void End();
  int64_t count() const;
  // Waits until no call is in flight or `seconds` pass; returns true when idle.
  bool WaitIdle(double seconds);

 private:
  mutable std::mutex mu_;
  std::condition_variable idle_;
  int64_t count_ = 0;
};

class GenerationService final : public snapserve::v1::Generation::CallbackService {
 public:
  explicit GenerationService(Metrics* metrics);

  // Ready: the model is loaded and `engine` serves. Draining: SIGTERM
  // arrived; new calls are refused. The engine must outlive the service.
  void SetReady(engine::Engine* engine) {
    engine_.store(engine);
    ready_.store(engine != nullptr);
  }
  void SetDraining(bool draining) { draining_.store(draining); }
  // With --auth-token-file: every call must carry the bearer token
  // (server/auth.h). Set before the server starts; must outlive the service.
  void SetAuth(const BearerAuth* auth) { auth_ = auth; }
  // With --otlp-endpoint: Generate calls are traced. Set before the server
  // starts; must outlive the service.
  void SetTracer(tracing::Tracer* tracer) { tracer_ = tracer; }
  InFlight& in_flight() { return in_flight_; }

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx,
                                     const snapserve::v1::GenerateRequest* request,
                                     snapserve::v1::GenerateResponse* response) override;
  grpc::ServerWriteReactor<snapserve::v1::GenerateStreamResponse>* GenerateStream(
      grpc::CallbackServerContext* ctx, const snapserve::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const snapserve::v1::TokenizeRequest* request,
                                     snapserve::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const snapserve::v1::GetModelInfoRequest* request,
                                         snapserve::v1::ModelInfo* response) override;

 private:
  // UNAUTHENTICATED without the bearer token (when one is configured), then
  // UNAVAILABLE while loading or draining; OK otherwise.
  grpc::Status Admission(const grpc::CallbackServerContext* ctx) const;
  // A call whose request bytes do not parse: UNAUTHENTICATED without the
  // bearer token (as Admission), else INTERNAL naming `request_type`.
  grpc::Status Unparsed(const grpc::CallbackServerContext* ctx,
                        const std::string& request_type) const;
  // Counts a Generate/GenerateStream call refused before it started.
  void RecordRefused(const grpc::Status& status) const;
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                        const grpc::Status& status);

  Metrics* metrics_;
  const BearerAuth* auth_ = nullptr;
  tracing::Tracer* tracer_ = nullptr;
  std::atomic<engine::Engine*> engine_{nullptr};
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  InFlight in_flight_;
};

}  // namespace snapserve::server
