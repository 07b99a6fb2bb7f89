// The server's configuration: every flag of `snapserve`, its default, and its
// help text. Flags come from the command line (`--kv-cache-memory=2GiB`) or,
// for Kubernetes, from environment variables named SNAPSERVE_<FLAG>
// (SNAPSERVE_KV_CACHE_MEMORY=2GiB); the command line wins.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/precision.h"

namespace snapserve::server {

struct ServerConfig {
  // Network.
  std::string host = "0.0.0.0";
  int port = 50051;
  int metrics_port = 9464;
  // Address of the /metrics listener; empty until parsed, then the --host
  // value unless --metrics-host says otherwise (so a loopback-only gRPC
  // server does not expose its metrics on every interface).
  std::string metrics_host;
  // The OpenAI-compatible HTTP API (server/http/): off unless set. It listens
  // on --host, with the gRPC port's TLS and bearer token.
  int http_port = 0;
  int64_t max_message_bytes = 16 << 20;
  std::string tls_cert;       // PEM file; enables TLS together with tls_key
  std::string tls_key;        // PEM file
  std::string tls_client_ca;  // PEM file; when set, clients must present a certificate it signed
  double shutdown_grace_s = 30;
  // File holding one bearer token; when set, every Generation call must send
  // `authorization: Bearer <token>` (server/auth.h). Health stays open.
  std::string auth_token_file;

  // The model, the engine's limits and the SnapKV defaults:
  // the engine's own options, whose defaults are the flags' defaults.
  engine::EngineOptions engine;
  // The precision preset and the detailed settings given explicitly; parsing
  // resolves them into `engine` (engine/precision.h) and keeps the line the
  // server logs at start-up.
  engine::Precision precision = engine::Precision::kAuto;
  engine::PrecisionOverrides precision_overrides;
  std::string precision_summary;

  std::string log_level = "info";

  // OpenTelemetry traces over OTLP/HTTP (server/tracing/): off unless the
  // collector's base URL is set (also from OTEL_EXPORTER_OTLP_ENDPOINT).
  std::string otlp_endpoint;
  std::string otlp_service_name = "snapserve";  // also from OTEL_SERVICE_NAME
};

// Outcome of parsing: either a config, or a message to print and an exit code
// (0 for --help, 2 for a bad flag).
struct ParseResult {
  ServerConfig config;
  bool exit = false;
  int exit_code = 0;
  std::string message;
  // Deprecated flag or variable names used (each still took effect), one
  // line each, for the log.
  std::vector<std::string> warnings;
};

// Parses argv (and SNAPSERVE_* environment variables through `getenv`).
ParseResult ParseServerConfig(const std::vector<std::string>& args,
                              char* (*getenv_fn)(const char*) = nullptr);

// The --help text: every flag, its environment variable and default.
std::string ServerHelp();

// The same as a Markdown table (`--help=markdown`), which README.md holds
// between its flags markers (a test compares the two).
std::string ServerHelpMarkdown();

// Parses sizes like "2GiB", "512MiB", "1e9", "1073741824". Returns -1 when invalid.
int64_t ParseByteSize(const std::string& text);

// The engine's enums from their names (engine_types.h): the one place strings
// become these types. On an unknown string, the error names the accepted
// values: "expected one of snapkv|streaming_llm|none, got 'x'".
StatusOr<engine::KvMethod> ParseKvMethod(const std::string& text);
StatusOr<engine::KvPooling> ParseKvPooling(const std::string& text);
StatusOr<engine::Dtype> ParseDtype(const std::string& text);
// ParseDtype's values and int8 (the KV cache's own).
StatusOr<engine::Dtype> ParseKvCacheDtype(const std::string& text);
StatusOr<engine::QuantDot> ParseQuantDot(const std::string& text);
StatusOr<engine::PrefillGemm> ParsePrefillGemm(const std::string& text);
StatusOr<engine::DecodeDot> ParseDecodeDot(const std::string& text);
StatusOr<engine::Precision> ParsePrecision(const std::string& text);
// "cpu", "cuda" or "cuda:N".
StatusOr<engine::Device> ParseDevice(const std::string& text);

}  // namespace snapserve::server
