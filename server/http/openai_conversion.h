// Between the OpenAI HTTP API and the gRPC one: an OpenAiRequest becomes the
// same snapserve.v1.GenerateRequest a gRPC client would send (so both front
// doors share one conversion and one validation path: ToEngineRequest,
// CheckRequest, Engine::Enqueue), and an engine Status becomes an HTTP status
// with OpenAI's JSON error body (docs/api.md, "HTTP errors").
#pragma once

#include <string>
#include <string_view>

#include "engine/common/status.h"
#include "engine/common/status_or.h"
#include "server/http/openai_request.h"
#include "snapserve/v1/generation.pb.h"

namespace snapserve::server::http {

// INVALID_ARGUMENT for an unknown kv_compression.method or .pooling name.
StatusOr<snapserve::v1::GenerateRequest> ToGenerateRequest(const OpenAiRequest& request);

struct HttpError {
  int status = 500;
  std::string body;  // {"error": {"message", "type", "param", "code"}}
};

// OpenAI's error shape. `param` empty: null.
HttpError MakeHttpError(int status, std::string_view message, std::string_view param = {},
                        std::string_view code = {});

// An engine status (not OK) as the HTTP client sees it: INVALID_ARGUMENT 400,
// RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, NOT_FOUND 404, DEADLINE_EXCEEDED
// 504, UNIMPLEMENTED 501, INTERNAL 500 with only the request id (the details
// go to the log, as over gRPC). A message naming a gRPC field
// ("stopping.max_new_tokens: ...") names the HTTP one instead ("max_tokens:
// ..."), which is also the error's `param`.
HttpError HttpErrorFromStatus(const Status& status, std::string_view request_id,
                              OpenAiEndpoint endpoint);

}  // namespace snapserve::server::http
