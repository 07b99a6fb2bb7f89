// server/request_conversion: the proto enums <-> the engine's types, and the
// one status-code table behind ToGrpc and GrpcCodeName.
#include "server/request_conversion.h"

#include <gtest/gtest.h>

namespace snapserve::server {
namespace {

namespace v1 = snapserve::v1;

TEST(RequestConversionTest, StatusCodesMapAndNameOnce) {
  const StatusCode all[] = {StatusCode::kOk,
                            StatusCode::kInvalidArgument,
                            StatusCode::kResourceExhausted,
                            StatusCode::kDeadlineExceeded,
                            StatusCode::kCancelled,
                            StatusCode::kUnavailable,
                            StatusCode::kNotFound,
                            StatusCode::kUnimplemented,
                            StatusCode::kInternal};
  for (StatusCode c : all) {
    const grpc::Status g = ToGrpc(c == StatusCode::kOk ? Status::Ok() : Status(c, "why"));
    // The gRPC code's name is the engine code's name: one table.
    EXPECT_EQ(GrpcCodeName(g.error_code()), status_code_name(c));
    if (c != StatusCode::kOk && c != StatusCode::kInternal) {
      EXPECT_EQ(g.error_message(), "why");
    }
  }
  EXPECT_EQ(ToGrpc(Status::ResourceExhausted("full")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::ABORTED), "UNKNOWN");  // not an engine code
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNKNOWN), "UNKNOWN");
}

TEST(RequestConversionTest, InternalErrorsGiveTheClientOnlyTheRequestId) {
  // What a c10::Error from a failed prefill looks like: text, then a backtrace.
  const std::string detail =
      "prefill failed: index out of range in self\nException raised from operator() at "
      "aten/src/ATen/native/TensorAdvancedIndexing.cpp:1189 (most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98";
  const grpc::Status g = ToGrpc(Status::Internal(detail), "req-7");
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(g.error_message(),
            "internal error in request req-7; the details are in the server log");
  EXPECT_EQ(ToGrpc(Status::Internal(detail)).error_message(),
            "internal error; the details are in the server log");
  // A client's huge id stays bounded here too.
  EXPECT_LT(ToGrpc(Status::Internal(detail), std::string(1 << 20, 'r')).error_message().size(),
            400u);
  // Other codes keep their message: it is the client's to act on.
  EXPECT_EQ(ToGrpc(Status::InvalidArgument("prompt: must not be empty"), "req-7").error_message(),
            "prompt: must not be empty");
}

TEST(RequestConversionTest, SplitSpecialTokensIsCarried) {
  v1::GenerateRequest r;
  r.set_prompt("<|im_end|>");
  EXPECT_FALSE(ToEngineRequest(r).split_special_tokens);  // default: parsed as control tokens
  r.set_split_special_tokens(true);
  EXPECT_TRUE(ToEngineRequest(r).split_special_tokens);
}

TEST(RequestConversionTest, KvCompressionEnums) {
  v1::GenerateRequest r;
  engine::GenerationRequest e = ToEngineRequest(r);
  EXPECT_FALSE(e.kv_compression.method.has_value());  // UNSPECIFIED: the server default
  EXPECT_FALSE(e.kv_compression.pooling.has_value());

  r.mutable_kv_compression()->set_method(v1::KvCompression::NONE);
  r.mutable_kv_compression()->set_pooling(v1::KvCompression::AVG);
  r.mutable_kv_compression()->set_window_size(8);
  r.mutable_kv_compression()->set_max_capacity_prompt(64);
  r.mutable_kv_compression()->set_kernel_size(5);
  e = ToEngineRequest(r);
  EXPECT_EQ(e.kv_compression.method, engine::KvMethod::kNone);
  EXPECT_EQ(e.kv_compression.pooling, engine::KvPooling::kAvg);
  EXPECT_EQ(e.kv_compression.window, 8u);
  EXPECT_EQ(e.kv_compression.capacity, 64u);
  EXPECT_EQ(e.kv_compression.kernel_size, 5u);

  r.mutable_kv_compression()->set_method(v1::KvCompression::SNAPKV);
  r.mutable_kv_compression()->set_pooling(v1::KvCompression::MAX);
  e = ToEngineRequest(r);
  EXPECT_EQ(e.kv_compression.method, engine::KvMethod::kSnapKv);
  EXPECT_EQ(e.kv_compression.pooling, engine::KvPooling::kMax);
  EXPECT_TRUE(CheckEnumValues(r).ok());

  r.mutable_kv_compression()->set_method(v1::KvCompression::STREAMING_LLM);
  r.mutable_kv_compression()->set_sink_tokens(2);
  e = ToEngineRequest(r);
  EXPECT_EQ(e.kv_compression.method, engine::KvMethod::kStreamingLlm);
  EXPECT_EQ(e.kv_compression.sink_tokens, 2u);
  EXPECT_TRUE(CheckEnumValues(r).ok());

  r.mutable_kv_compression()->set_method(static_cast<v1::KvCompression::Method>(9));
  EXPECT_EQ(CheckEnumValues(r).message(), "kv_compression.method: unknown value 9");
}

TEST(RequestConversionTest, LogprobOptionsAndResults) {
  v1::GenerateRequest r;
  engine::GenerationRequest e = ToEngineRequest(r);
  EXPECT_FALSE(e.logprobs.enabled);  // unset: off
  EXPECT_EQ(e.logprobs.top_logprobs, 0u);
  r.mutable_logprobs()->set_enabled(true);
  r.mutable_logprobs()->set_top_logprobs(21);  // copied as is: the engine validates
  e = ToEngineRequest(r);
  EXPECT_TRUE(e.logprobs.enabled);
  EXPECT_EQ(e.logprobs.top_logprobs, 21u);

  const std::vector<engine::TokenLogprob> logprobs = {
      {7, -0.5f, {{7, -0.5f}, {3, -1.5f}}},
      {9, -2.f, {}},
  };
  v1::GenerateResponse response;
  AddLogprobs(logprobs, response.mutable_logprobs());
  AddLogprobs({}, response.mutable_logprobs());  // a delta without tokens adds nothing
  ASSERT_EQ(response.logprobs_size(), 2);
  EXPECT_EQ(response.logprobs(0).token_id(), 7u);
  EXPECT_EQ(response.logprobs(0).logprob(), -0.5f);
  ASSERT_EQ(response.logprobs(0).top_logprobs_size(), 2);
  EXPECT_EQ(response.logprobs(0).top_logprobs(1).token_id(), 3u);
  EXPECT_EQ(response.logprobs(0).top_logprobs(1).logprob(), -1.5f);
  EXPECT_EQ(response.logprobs(1).token_id(), 9u);
  EXPECT_EQ(response.logprobs(1).top_logprobs_size(), 0);
}

TEST(RequestConversionTest, FinishReasons) {
  EXPECT_EQ(ToProto(engine::FinishReason::kLength), v1::LENGTH);
  EXPECT_EQ(ToProto(engine::FinishReason::kEos), v1::EOS);
  EXPECT_EQ(ToProto(engine::FinishReason::kStopSequence), v1::STOP_SEQUENCE);
  EXPECT_EQ(ToProto(engine::FinishReason::kStopToken), v1::STOP_TOKEN);
  EXPECT_EQ(ToProto(engine::FinishReason::kUnspecified), v1::FINISH_REASON_UNSPECIFIED);
}

TEST(RequestConversionTest, ModelInfoSpellsTheEngineTypes) {
  engine::ModelSummary s;
  s.dtype = engine::Dtype::kBFloat16;
  s.device = engine::Device::Cuda(1);
  s.default_kv_compression.method = engine::KvMethod::kNone;
  s.default_kv_compression.pooling = engine::KvPooling::kAvg;
  s.default_kv_compression.window = 16;
  v1::ModelInfo info;
  FillModelInfo(s, &info);
  EXPECT_EQ(info.dtype(), "bfloat16");
  EXPECT_EQ(info.device(), "cuda:1");
  EXPECT_EQ(info.default_kv_compression().method(), v1::KvCompression::NONE);
  EXPECT_EQ(info.default_kv_compression().pooling(), v1::KvCompression::AVG);
  EXPECT_EQ(info.default_kv_compression().window_size(), 16u);
  EXPECT_EQ(info.default_kv_compression().max_capacity_prompt(), 1024u);
  EXPECT_EQ(info.default_kv_compression().kernel_size(), 7u);
  EXPECT_EQ(info.default_kv_compression().sink_tokens(), 4u);

  s.default_kv_compression.method = engine::KvMethod::kStreamingLlm;
  FillModelInfo(s, &info);
  EXPECT_EQ(info.default_kv_compression().method(), v1::KvCompression::STREAMING_LLM);
  EXPECT_EQ(ToProto(engine::KvMethod::kSnapKv), v1::KvCompression::SNAPKV);
}

}  // namespace
}  // namespace snapserve::server
