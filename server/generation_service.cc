#include "server/generation_service.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "server/auth.h"
#include "server/generate_calls.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/request_conversion.h"

namespace snapserve::server {

using snapserve::v1::GenerateStreamResponse;

void InFlight::Begin() {
  std::lock_guard<std::mutex> lock(mu_);
  ++count_;
}

void InFlight::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--count_ == 0) idle_.notify_all();
}

int64_t InFlight::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

bool InFlight::WaitIdle(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return count_ == 0; });
}

namespace {

using grpc::internal::MethodHandler;
using snapserve::v1::GenerateRequest;
using snapserve::v1::GenerateResponse;

// A streaming call that ends at once with `status` (refused or unimplemented).
class FinishedWriter final : public grpc::ServerWriteReactor<GenerateStreamResponse> {
 public:
  explicit FinishedWriter(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// gRPC's callback handlers drop the status of a request that does not parse
// and answer UNIMPLEMENTED with an empty message, which reads as "no such
// method" (grpcpp/impl/codegen/server_callback_handlers.h, RunHandler). This
// handler keeps the distinction: a request that parses runs `parsed`; one
// that does not runs `unparsed`, a handler of the same type, as if it had
// parsed. Both read only what `parsed`'s Deserialize left (a unary call's
// message holder in the call's arena, a stream's null request), so running
// either on it is what the generated handler would do.
class ParseCheckedHandler final : public MethodHandler {
 public:
  ParseCheckedHandler(MethodHandler* parsed, MethodHandler* unparsed)
      : parsed_(parsed), unparsed_(unparsed) {}

  void* Deserialize(grpc_call* call, grpc_byte_buffer* request, grpc::Status* status,
                    void** handler_data) override {
    return parsed_->Deserialize(call, request, status, handler_data);
  }

  void RunHandler(const HandlerParameter& param) override {
    if (param.status.ok()) {
      parsed_->RunHandler(param);
      return;
    }
    unparsed_->RunHandler(HandlerParameter(param.call, param.server_context, param.request,
                                           grpc::Status::OK, param.internal_data,
                                           param.call_requester));
  }

 private:
  std::unique_ptr<MethodHandler> parsed_;
  std::unique_ptr<MethodHandler> unparsed_;
};

using Refusal = std::function<grpc::Status(const grpc::CallbackServerContext*, const std::string&)>;

template <class Request, class Response>
MethodHandler* CheckedUnary(std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*,
                                                                    const Request*, Response*)>
                                run,
                            Refusal refuse) {
  using Handler = grpc::internal::CallbackUnaryHandler<Request, Response>;
  auto finish = [refuse = std::move(refuse), type = Request::default_instance().GetTypeName()](
                    grpc::CallbackServerContext* ctx, const Request*, Response*) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(refuse(ctx, type));
    return reactor;
  };
  return new ParseCheckedHandler(new Handler(std::move(run)), new Handler(std::move(finish)));
}

MethodHandler* CheckedStream(std::function<grpc::ServerWriteReactor<GenerateStreamResponse>*(
                                 grpc::CallbackServerContext*, const GenerateRequest*)>
                                 run,
                             Refusal refuse) {
  using Handler =
      grpc::internal::CallbackServerStreamingHandler<GenerateRequest, GenerateStreamResponse>;
  auto finish = [refuse = std::move(refuse),
                 type = GenerateRequest::default_instance().GetTypeName()](
                    grpc::CallbackServerContext* ctx, const GenerateRequest*) {
    return new FinishedWriter(refuse(ctx, type));
  };
  return new ParseCheckedHandler(new Handler(std::move(run)), new Handler(std::move(finish)));
}

}  // namespace

GenerationService::GenerationService(Metrics* metrics) : metrics_(metrics) {
  // Replaces the generated callback handlers, at the generated indices (the
  // methods' order in generation.proto); nothing here uses the generated
  // SetMessageAllocatorFor_* methods, which expect their own handler type.
  // test_server_faults.py sends unparseable bytes to each method and checks
  // the message names that method's request type.
  Refusal refuse = [this](const grpc::CallbackServerContext* ctx, const std::string& type) {
    return Unparsed(ctx, type);
  };
  MarkMethodCallback(0, CheckedUnary<GenerateRequest, GenerateResponse>(
                            [this](auto* ctx, auto* request, auto* response) {
                              return Generate(ctx, request, response);
                            },
                            refuse));
  MarkMethodCallback(
      1, CheckedStream([this](auto* ctx, auto* request) { return GenerateStream(ctx, request); },
                       refuse));
  MarkMethodCallback(2,
                     CheckedUnary<snapserve::v1::TokenizeRequest, snapserve::v1::TokenizeResponse>(
                         [this](auto* ctx, auto* request, auto* response) {
                           return Tokenize(ctx, request, response);
                         },
                         refuse));
  MarkMethodCallback(3, CheckedUnary<snapserve::v1::GetModelInfoRequest, snapserve::v1::ModelInfo>(
                            [this](auto* ctx, auto* request, auto* response) {
                              return GetModelInfo(ctx, request, response);
                            },
                            refuse));
}

grpc::Status GenerationService::Unparsed(const grpc::CallbackServerContext* ctx,
                                         const std::string& request_type) const {
  if (auth_ != nullptr) {
    if (grpc::Status status = auth_->Check(ctx->client_metadata()); !status.ok()) return status;
  }
  return {grpc::StatusCode::INTERNAL, "request bytes do not parse as " + request_type};
}

grpc::Status GenerationService::Admission(const grpc::CallbackServerContext* ctx) const {
  // Authentication first, so a caller without the token learns nothing about
  // the server's state.
  if (auth_ != nullptr) {
    if (grpc::Status status = auth_->Check(ctx->client_metadata()); !status.ok()) return status;
  }
  if (draining_.load()) return {grpc::StatusCode::UNAVAILABLE, "server is draining"};
  if (!ready_.load()) return {grpc::StatusCode::UNAVAILABLE, "model is loading"};
  return grpc::Status::OK;
}

void GenerationService::RecordRefused(const grpc::Status& status) const {
  if (metrics_ == nullptr) return;
  // UNAUTHENTICATED is the one refusal with no engine status (GrpcCodeName
  // would say UNKNOWN): named here, so that calls without the token show on
  // the dashboards (docs/metrics.md).
  const bool unauthenticated = status.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  metrics_->RecordRequest(
      {.status = unauthenticated ? "UNAUTHENTICATED" : GrpcCodeName(status.error_code())});
}

grpc::ServerUnaryReactor* GenerationService::FinishUnary(grpc::CallbackServerContext* ctx,
                                                         const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                      const snapserve::v1::GenerateRequest* request,
                                                      snapserve::v1::GenerateResponse* response) {
  grpc::Status status = Admission(ctx);
  if (!status.ok()) {
    RecordRefused(status);
    return FinishUnary(ctx, status);
  }
  return StartGenerateCall({engine_.load(), metrics_, &in_flight_, tracer_}, ctx, request,
                           response);
}

grpc::ServerWriteReactor<GenerateStreamResponse>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* ctx, const snapserve::v1::GenerateRequest* request) {
  grpc::Status status = Admission(ctx);
  if (!status.ok()) {
    RecordRefused(status);
    return new FinishedWriter(status);
  }
  return StartGenerateStreamCall({engine_.load(), metrics_, &in_flight_, tracer_}, ctx, request);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const snapserve::v1::TokenizeRequest* request,
                                                      snapserve::v1::TokenizeResponse* response) {
  grpc::Status status = Admission(ctx);
  if (status.ok()) {
    StatusOr<std::vector<uint32_t>> ids = engine_.load()->Tokenize(
        request->text(), request->add_special_tokens(), request->split_special_tokens());
    if (ids.ok()) {
      response->mutable_ids()->Add(ids->begin(), ids->end());
    } else {
      status = ToGrpc(ids.status());
      if (status.error_code() == grpc::StatusCode::INTERNAL) {
        LogEvent("error", "tokenize_failed", {{"error", ids.status().message()}});
      }
    }
  }
  return FinishUnary(ctx, status);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                          const snapserve::v1::GetModelInfoRequest*,
                                                          snapserve::v1::ModelInfo* response) {
  grpc::Status status = Admission(ctx);
  if (status.ok()) FillModelInfo(engine_.load()->model(), response);
  return FinishUnary(ctx, status);
}

}  // namespace snapserve::server
