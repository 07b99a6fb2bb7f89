// Translation between the API's protobuf messages and the engine's plain
// structs, and between engine Status codes and gRPC status codes (the one
// place they are mapped). Includes no LibTorch header.
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "snapserve/v1/generation.pb.h"

namespace snapserve::server {

// Copies the request's fields; validation is the engine's job.
engine::GenerationRequest ToEngineRequest(const snapserve::v1::GenerateRequest& request);

// INVALID_ARGUMENT for enum values this server does not know (proto3 enums are
// open, so a newer client can send them). The engine's structs cannot carry
// such values, so this is the one check made before ToEngineRequest.
Status CheckEnumValues(const snapserve::v1::GenerateRequest& request);

snapserve::v1::FinishReason ToProto(engine::FinishReason reason);
snapserve::v1::KvCompression::Method ToProto(engine::KvMethod method);
void FillUsage(const engine::Usage& usage, snapserve::v1::Usage* out);
// Appends one TokenLogprob per entry of `logprobs`.
void AddLogprobs(const std::vector<engine::TokenLogprob>& logprobs,
                 google::protobuf::RepeatedPtrField<snapserve::v1::TokenLogprob>* out);
void FillModelInfo(const engine::ModelSummary& summary, snapserve::v1::ModelInfo* out);

// The status a client receives. INTERNAL is an engine fault whose message may
// hold exception text and C++ backtraces (c10::Error::what()): the client gets
// only "internal error" and the request id, the details go to the log
// (ReportCall in generate_calls.cc). Every other code keeps its message.
grpc::Status ToGrpc(const Status& status, std::string_view request_id = {});
// "OK", "INVALID_ARGUMENT", ... as Prometheus labels and logs spell them.
std::string GrpcCodeName(grpc::StatusCode code);

// A fresh random request id (32 hex digits) for requests that bring none.
std::string NewRequestId();

}  // namespace snapserve::server
