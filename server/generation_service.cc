#include "server/generation_service.h"

#include <chrono>

#include "server/metrics.h"

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

grpc::Status GenerationService::Admission() const {
  if (draining_.load()) return {grpc::StatusCode::UNAVAILABLE, "server is draining"};
  if (!ready_.load()) return {grpc::StatusCode::UNAVAILABLE, "model is loading"};
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* GenerationService::FinishUnary(grpc::CallbackServerContext* ctx,
                                                         const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                      const snapserve::v1::GenerateRequest*,
                                                      snapserve::v1::GenerateResponse*) {
  const auto started = std::chrono::steady_clock::now();
  grpc::Status status = Admission();
  if (status.ok()) {
    status = {grpc::StatusCode::UNIMPLEMENTED,
              "Generate is not served yet: the batching engine has not landed"};
  }
  if (metrics_ != nullptr) {
    RequestRecord record;
    record.status = status.ok() ? "OK" : (status.error_code() == grpc::StatusCode::UNAVAILABLE
                                              ? "UNAVAILABLE"
                                              : "UNIMPLEMENTED");
    record.total_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    metrics_->RecordRequest(record);
  }
  return FinishUnary(ctx, status);
}

grpc::ServerWriteReactor<GenerateStreamResponse>* GenerationService::GenerateStream(
    grpc::CallbackServerContext*, const snapserve::v1::GenerateRequest*) {
  grpc::Status status = Admission();
  if (status.ok()) {
    status = {grpc::StatusCode::UNIMPLEMENTED,
              "GenerateStream is not served yet: the batching engine has not landed"};
  }
  return new FinishedWriter(status);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const snapserve::v1::TokenizeRequest*,
                                                      snapserve::v1::TokenizeResponse*) {
  grpc::Status status = Admission();
  if (status.ok()) {
    status = {grpc::StatusCode::UNIMPLEMENTED, "Tokenize is not served yet: no tokenizer"};
  }
  return FinishUnary(ctx, status);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                          const snapserve::v1::GetModelInfoRequest*,
                                                          snapserve::v1::ModelInfo*) {
  grpc::Status status = Admission();
  if (status.ok()) {
    status = {grpc::StatusCode::UNIMPLEMENTED, "GetModelInfo is not served yet: no model loader"};
  }
  return FinishUnary(ctx, status);
}

}  // namespace snapserve::server
