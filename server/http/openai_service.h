// The OpenAI-compatible API's routes (docs/api.md, "The OpenAI-compatible
// HTTP API"): POST /v1/completions, POST /v1/chat/completions, GET
// /v1/models, GET /health. Generation goes the way a gRPC call goes (the
// request becomes a GenerateRequest, then ToEngineRequest, CheckRequest,
// Engine::Enqueue), into the same engine, counted in the same metrics,
// logged with the same `inference_complete` line and tracked by the same
// InFlight that SIGTERM drains. The bearer token, when configured, is the
// gRPC port's; /health needs none.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "engine/engine.h"
#include "server/http/http_server.h"
#include "server/http/openai_request.h"

namespace snapserve::server {
class BearerAuth;
class InFlight;
class Metrics;
namespace tracing {
class Tracer;
}
}  // namespace snapserve::server

namespace snapserve::server::http {

class OpenAiService {
 public:
  // Both must outlive the service.
  OpenAiService(Metrics* metrics, InFlight* in_flight);

  // As GenerationService's: set before serving, must outlive the service.
  void SetAuth(const BearerAuth* auth) { auth_ = auth; }
  // The model is loaded and `engine` serves (nullptr: not, or no longer).
  void SetReady(engine::Engine* engine) { engine_.store(engine); }
  // SIGTERM arrived: new generation is refused with 503.
  void SetDraining(bool draining) { draining_.store(draining); }
  // With --otlp-endpoint: generation is traced. Set before serving; must
  // outlive the service.
  void SetTracer(tracing::Tracer* tracer) { tracer_ = tracer; }

  // HttpServer's handler.
  void Handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);

 private:
  void Generate(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder,
                OpenAiEndpoint endpoint, engine::Engine* engine);
  void Models(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder,
              engine::Engine* engine) const;
  // A failed bearer-token check, answered 401; false when the request may go on.
  bool Unauthorized(const HttpRequest& request, const std::shared_ptr<HttpResponder>& responder,
                    bool count) const;

  Metrics* metrics_;
  InFlight* in_flight_;
  const BearerAuth* auth_ = nullptr;
  tracing::Tracer* tracer_ = nullptr;
  std::atomic<engine::Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  const int64_t started_ = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
};

}  // namespace snapserve::server::http
