#include "server/generation_service.h"

#include <chrono>

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

// A streaming call that ends at once with `status` (refused or unimplemented).
class FinishedWriter final : public grpc::ServerWriteReactor<GenerateStreamResponse> {
 public:
  explicit FinishedWriter(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

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
  return StartGenerateCall({engine_.load(), metrics_, &in_flight_}, ctx, request, response);
}

grpc::ServerWriteReactor<GenerateStreamResponse>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* ctx, const snapserve::v1::GenerateRequest* request) {
  grpc::Status status = Admission(ctx);
  if (!status.ok()) {
    RecordRefused(status);
    return new FinishedWriter(status);
  }
  return StartGenerateStreamCall({engine_.load(), metrics_, &in_flight_}, ctx, request);
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
