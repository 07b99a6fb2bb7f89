#include "server/http/openai_service.h"

#include <optional>
#include <string>
#include <vector>

#include "server/auth.h"
#include "server/generate_calls.h"
#include "server/generation_service.h"
#include "server/http/openai_conversion.h"
#include "server/http/openai_response.h"
#include "server/metrics.h"
#include "server/request_conversion.h"
#include "server/tracing/tracer.h"

namespace snapserve::server::http {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr char kJson[] = "application/json";

void Send(const std::shared_ptr<HttpResponder>& responder, const HttpError& error,
          std::string extra_headers = {}) {
  responder->Reply(error.status, kJson, error.body, std::move(extra_headers));
}

// One generation request from Enqueue to its last byte. The engine's sink
// only posts to the connection's strand; everything else, JSON included,
// runs there, so the scheduler thread never formats or writes.
class OpenAiCall : public std::enable_shared_from_this<OpenAiCall> {
 public:
  struct Setup {
    engine::Engine* engine;
    Metrics* metrics;
    InFlight* in_flight;
    std::shared_ptr<HttpResponder> responder;
    ResponseHeader header;
    std::string request_id;
    bool stream;
    bool include_usage;
    bool logprobs;
    Clock::time_point arrival;
    std::optional<tracing::RequestTrace> trace;
  };

  explicit OpenAiCall(Setup setup) : s_(std::move(setup)) { s_.in_flight->Begin(); }
  ~OpenAiCall() { s_.in_flight->End(); }

  HttpResponder& responder() { return *s_.responder; }
  const std::string& request_id() const { return s_.request_id; }

  // Called once the request is queued: a stream's head and (chat) its first
  // chunk, which names the role; a disconnect from now on cancels the request.
  void Started() {
    if (s_.stream) {
      s_.responder->StartEvents();
      if (s_.header.endpoint == OpenAiEndpoint::kChatCompletions) {
        s_.responder->Event(
            Dump(ChunkJson(s_.header, "", nullptr, nullptr, /*first=*/true, s_.include_usage)));
      }
    }
    s_.responder->OnClientGone([self = shared_from_this()] {
      self->client_gone_ = true;
      self->s_.engine->Cancel(self->s_.request_id);
    });
  }

  void Delta(const std::vector<uint32_t>& ids, const std::string& text,
             const std::vector<engine::TokenLogprob>& logprobs) {
    (void)ids;
    if (!s_.stream) {
      text_ += text;
      logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
      return;
    }
    if (text.empty() && logprobs.empty()) return;
    s_.responder->Event(Dump(ChunkJson(s_.header, text, LogprobsOrNull(logprobs), nullptr,
                                       /*first=*/false, s_.include_usage)));
  }

  void Finish(const Status& status, engine::FinishReason reason, const engine::Usage& usage) {
    const grpc::Status client = ToGrpc(status, s_.request_id);
    ReportCall(s_.metrics, s_.request_id, client, status, reason, usage, /*reached_engine=*/true,
               s_.arrival, s_.trace ? &*s_.trace : nullptr);
    if (client_gone_) return;
    if (!status.ok()) {
      const HttpError error = HttpErrorFromStatus(status, s_.request_id, s_.header.endpoint);
      if (!s_.stream) return Send(s_.responder, error);
      // Headers are out: the error travels as an event (as vLLM sends it).
      s_.responder->Event(error.body);
      s_.responder->Event("[DONE]");
      return s_.responder->EndEvents();
    }
    if (!s_.stream) {
      s_.responder->Reply(
          200, kJson,
          Dump(CompletionJson(s_.header, text_, reason, usage, LogprobsOrNull(logprobs_))));
      return;
    }
    s_.responder->Event(Dump(ChunkJson(s_.header, "", nullptr, FinishReasonJson(reason),
                                       /*first=*/false, s_.include_usage)));
    if (s_.include_usage) s_.responder->Event(Dump(UsageChunkJson(s_.header, usage)));
    s_.responder->Event("[DONE]");
    s_.responder->EndEvents();
  }

 private:
  json LogprobsOrNull(const std::vector<engine::TokenLogprob>& logprobs) {
    if (!s_.logprobs) return nullptr;
    engine::Engine* engine = s_.engine;
    return LogprobsJson(
        s_.header.endpoint, logprobs, [engine](uint32_t id) { return engine->TokenBytes(id); },
        &text_offset_);
  }

  Setup s_;
  std::string text_;
  std::vector<engine::TokenLogprob> logprobs_;
  size_t text_offset_ = 0;
  bool client_gone_ = false;
};

class CallSink final : public engine::ResultSink {
 public:
  explicit CallSink(std::shared_ptr<OpenAiCall> call) : call_(std::move(call)) {}

  void OnDelta(const std::vector<uint32_t>& ids, const std::string& text,
               const std::vector<engine::TokenLogprob>& logprobs) override {
    call_->responder().Post(
        [call = call_, ids, text, logprobs] { call->Delta(ids, text, logprobs); });
  }
  void OnFinish(const Status& status, engine::FinishReason reason,
                const engine::Usage& usage) override {
    call_->responder().Post(
        [call = call_, status, reason, usage] { call->Finish(status, reason, usage); });
  }

 private:
  std::shared_ptr<OpenAiCall> call_;
};

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json ModelJson(const engine::ModelSummary& model, int64_t created) {
  return {{"id", model.model_id},
          {"object", "model"},
          {"created", created},
          {"owned_by", "snapserve"},
          {"max_model_len", model.max_context_length}};
}

}  // namespace

OpenAiService::OpenAiService(Metrics* metrics, InFlight* in_flight)
    : metrics_(metrics), in_flight_(in_flight) {}

bool OpenAiService::Unauthorized(const HttpRequest& request,
                                 const std::shared_ptr<HttpResponder>& responder,
                                 bool count) const {
  if (auth_ == nullptr) return false;
  const BearerParse bearer = ParseBearer(request.authorization);
  if (bearer.ok && auth_->Matches(bearer.token)) return false;
  // As over gRPC: refused before anything about the server's state is said,
  // and the header is never echoed.
  if (count && metrics_ != nullptr) metrics_->RecordRequest({.status = "UNAUTHENTICATED"});
  Send(responder,
       MakeHttpError(401, "missing or invalid bearer token (Authorization: Bearer <token>)", {},
                     "invalid_api_key"),
       "WWW-Authenticate: Bearer\r\n");
  return true;
}

void OpenAiService::Handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  engine::Engine* engine = engine_.load();
  const std::string& path = request.path;
  auto wrong_method = [&](const char* allowed) {
    Send(responder, MakeHttpError(405, request.method + " is not allowed on " + path),
         std::string("Allow: ") + allowed + "\r\n");
  };
  if (path == "/health") {
    if (request.method != "GET") return wrong_method("GET");
    const bool serving = engine != nullptr && !draining_.load();
    const char* state = serving ? "ok" : (draining_.load() ? "draining" : "loading");
    return responder->Reply(serving ? 200 : 503, kJson, Dump({{"status", state}}));
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (request.method != "GET") return wrong_method("GET");
    if (Unauthorized(request, responder, /*count=*/false)) return;
    if (engine == nullptr) return Send(responder, MakeHttpError(503, "model is loading"));
    return Models(request, responder, engine);
  }
  const bool completions = path == "/v1/completions";
  if (completions || path == "/v1/chat/completions") {
    if (request.method != "POST") return wrong_method("POST");
    if (Unauthorized(request, responder, /*count=*/true)) return;
    if (draining_.load() || engine == nullptr) {
      if (metrics_ != nullptr) metrics_->RecordRequest({.status = "UNAVAILABLE"});
      return Send(responder,
                  MakeHttpError(503, draining_.load() ? "server is draining" : "model is loading"));
    }
    return Generate(request, responder,
                    completions ? OpenAiEndpoint::kCompletions : OpenAiEndpoint::kChatCompletions,
                    engine);
  }
  Send(responder, MakeHttpError(404, "no route " + path +
                                         " (POST /v1/completions, POST /v1/chat/completions, "
                                         "GET /v1/models, GET /health)"));
}

void OpenAiService::Models(const HttpRequest& request,
                           const std::shared_ptr<HttpResponder>& responder,
                           engine::Engine* engine) const {
  const engine::ModelSummary& model = engine->model();
  if (request.path == "/v1/models") {
    return responder->Reply(
        200, kJson,
        Dump({{"object", "list"}, {"data", json::array({ModelJson(model, started_)})}}));
  }
  const std::string id = request.path.substr(std::string("/v1/models/").size());
  if (id != model.model_id) {
    return Send(responder, MakeHttpError(404, "the model '" + id + "' does not exist", "model",
                                         "model_not_found"));
  }
  responder->Reply(200, kJson, Dump(ModelJson(model, started_)));
}

void OpenAiService::Generate(const HttpRequest& request,
                             const std::shared_ptr<HttpResponder>& responder,
                             OpenAiEndpoint endpoint, engine::Engine* engine) {
  const Clock::time_point arrival = Clock::now();
  const std::string request_id = NewRequestId();
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  std::optional<tracing::RequestTrace> trace;
  if (tracer_ != nullptr) {
    trace = tracer_->Begin(request.traceparent, "http", chat ? "chat" : "text_completion",
                           engine->model().model_id, request_id);
  }
  // A request refused before the engine: metrics, log and trace as over gRPC.
  auto refuse = [&](const Status& status, const HttpError& error) {
    ReportCall(metrics_, request_id, ToGrpc(status, request_id), status, {}, {},
               /*reached_engine=*/false, arrival, trace ? &*trace : nullptr);
    Send(responder, error);
  };
  const OpenAiParse parsed = ParseOpenAiRequest(request.body, endpoint);
  if (!parsed.request) {
    return refuse(Status::InvalidArgument(parsed.error.message),
                  MakeHttpError(400, parsed.error.message, parsed.error.param));
  }
  const OpenAiRequest& r = *parsed.request;
  const std::string& model_id = engine->model().model_id;
  if (r.model && *r.model != model_id) {
    const std::string message =
        "the model '" + *r.model + "' does not exist (this server serves '" + model_id + "')";
    return refuse(Status::NotFound(message),
                  MakeHttpError(404, message, "model", "model_not_found"));
  }
  StatusOr<snapserve::v1::GenerateRequest> proto = ToGenerateRequest(r);
  if (!proto.ok()) {
    return refuse(proto.status(), HttpErrorFromStatus(proto.status(), request_id, endpoint));
  }
  engine::GenerationRequest converted = ToEngineRequest(*proto);
  converted.request_id = request_id;
  converted.arrival = arrival;
  if (trace) {
    trace->max_tokens = converted.max_new_tokens;
    trace->temperature = converted.temperature;
    trace->top_p = converted.top_p;
  }

  auto call = std::make_shared<OpenAiCall>(OpenAiCall::Setup{
      .engine = engine,
      .metrics = metrics_,
      .in_flight = in_flight_,
      .responder = responder,
      .header = {endpoint, (chat ? "chatcmpl-" : "cmpl-") + request_id, UnixSeconds(), model_id},
      .request_id = request_id,
      .stream = r.stream,
      .include_usage = r.include_usage,
      .logprobs = r.logprobs,
      .arrival = arrival,
      .trace = trace,
  });
  Status queued = CheckRequest(*engine, *proto, converted);
  if (queued.ok()) queued = engine->Enqueue(std::move(converted), std::make_shared<CallSink>(call));
  if (!queued.ok()) return refuse(queued, HttpErrorFromStatus(queued, request_id, endpoint));
  // Runs on the strand before any of the sink's posts can.
  call->Started();
}

}  // namespace snapserve::server::http
