// snapserve: the gRPC inference server's entry point. Parses flags, starts
// the metrics endpoint, the gRPC server (Generation, grpc.health.v1, server
// reflection) and, with --http-port, the OpenAI-compatible HTTP API, loads
// the model, and on SIGTERM/SIGINT drains in-flight calls of both within
// --shutdown-grace before exiting 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/auth.h"
#include "server/generation_service.h"
#include "server/http/http_server.h"
#include "server/http/openai_service.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/server_config.h"
#include "server/tracing/tracer.h"

namespace snapserve::server {
namespace {

constexpr char kServiceName[] = "snapserve.v1.Generation";

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

// Plain TCP, TLS, or mutual TLS, from the --tls-* flags.
std::shared_ptr<grpc::ServerCredentials> MakeCredentials(const ServerConfig& c,
                                                         std::string* error) {
  if (c.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  if (!ReadFile(c.tls_cert, &pair.cert_chain)) *error = "cannot read --tls-cert " + c.tls_cert;
  if (!ReadFile(c.tls_key, &pair.private_key)) *error = "cannot read --tls-key " + c.tls_key;
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!c.tls_client_ca.empty()) {
    if (!ReadFile(c.tls_client_ca, &options.pem_root_certs)) {
      *error = "cannot read --tls-client-ca " + c.tls_client_ca;
    }
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  options.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(options);
}

int Run(const ServerConfig& config) {
  // Signals are taken by sigwait() below, never by a handler: block them
  // before any thread starts so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (config.engine.model_path.empty()) {
    LogEvent("error", "startup_failed", {{"error", "--model is required (see --help)"}});
    return 2;
  }

  // Read before anything listens, so a bad token file fails startup.
  std::unique_ptr<BearerAuth> auth;
  if (!config.auth_token_file.empty()) {
    StatusOr<std::string> token = ReadAuthTokenFile(config.auth_token_file);
    if (!token.ok()) {
      LogEvent("error", "startup_failed", {{"error", token.status().message()}});
      return 2;
    }
    auth = std::make_unique<BearerAuth>(*token);
  }

  Metrics metrics;
  if (config.metrics_port > 0) {
    if (std::string err = metrics.Serve(config.metrics_host, config.metrics_port); !err.empty()) {
      LogEvent("error", "startup_failed", {{"error", "metrics endpoint: " + err}});
      return 1;
    }
    LogEvent("info", "metrics_listening", {{"address", metrics.address()}});
  }

  // Traces: the exporter's thread starts here and, declared before the
  // engine, is stopped after it, sending what the last requests left.
  std::unique_ptr<tracing::Tracer> tracer;
  if (!config.otlp_endpoint.empty()) {
    tracer = std::make_unique<tracing::Tracer>(
        tracing::TracerOptions{config.otlp_endpoint, config.otlp_service_name}, metrics.registry());
    LogEvent("info", "tracing",
             {{"endpoint", config.otlp_endpoint}, {"service_name", config.otlp_service_name}});
  }

  GenerationService service(&metrics);
  service.SetAuth(auth.get());
  service.SetTracer(tracer.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::string error;
  auto credentials = MakeCredentials(config, &error);
  if (!error.empty()) {
    LogEvent("error", "startup_failed", {{"error", error}});
    return 2;
  }
  const std::string address = config.host + ":" + std::to_string(config.port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    LogEvent("error", "startup_failed", {{"error", "cannot listen on " + address}});
    return 1;
  }
  // The HTTP front door listens from the start too, answering 503 until the
  // model is loaded. Declared before the engine: it must outlive it, since
  // the engine's sinks hold its connections until the engine is destroyed.
  http::OpenAiService openai(&metrics, &service.in_flight());
  openai.SetAuth(auth.get());
  openai.SetTracer(tracer.get());
  std::unique_ptr<http::HttpServer> http_server;
  if (config.http_port > 0) {
    http_server = std::make_unique<http::HttpServer>(
        http::HttpServerOptions{.host = config.host,
                                .port = config.http_port,
                                .tls_cert = config.tls_cert,
                                .tls_key = config.tls_key,
                                .tls_client_ca = config.tls_client_ca,
                                .max_body_bytes = static_cast<size_t>(config.max_message_bytes)},
        [&openai](const http::HttpRequest& request, std::shared_ptr<http::HttpResponder> r) {
          openai.Handle(request, std::move(r));
        });
    if (std::string err = http_server->Start(); !err.empty()) {
      LogEvent("error", "startup_failed", {{"error", "HTTP API: " + err}});
      server->Shutdown();
      return 1;
    }
    LogEvent("info", "http_listening",
             {{"address", http_server->address()},
              {"port", http_server->port()},
              {"tls", !config.tls_cert.empty()},
              {"auth", auth != nullptr}});
  }
  auto* health = server->GetHealthCheckService();
  // NOT_SERVING while the model loads, for the server ("") and for the
  // Generation service by name (unregistered, it would answer NOT_FOUND).
  health->SetServingStatus(kServiceName, false);
  health->SetServingStatus(false);
  LogEvent("info", "grpc_listening",
           {{"address", address},
            {"port", bound_port},
            {"tls", !config.tls_cert.empty()},
            {"mtls", !config.tls_client_ca.empty()},
            {"auth", auth != nullptr}});

  LogEvent("info", "model_loading", {{"model", config.engine.model_path}});
  LogEvent("info", "precision", {{"message", config.precision_summary}});
  const auto load_start = std::chrono::steady_clock::now();
  auto engine = engine::Engine::Create(config.engine, [](const std::string& line) {
    LogEvent("info", "model_loading_progress", {{"message", line}});
  });
  if (!engine.ok()) {
    LogEvent("error", "startup_failed", {{"error", engine.status().ToString()}});
    server->Shutdown();
    return 1;
  }
  (*engine)->SetObserver({
      .on_decode_step = [&metrics](int64_t batch) { metrics.ObserveBatchSize(batch); },
      .on_inter_token_latency = [&metrics](double s) { metrics.ObserveInterTokenLatency(s); },
  });
  (*engine)->SetKvStoreLogger([](const std::string& line) {
    LogEvent("warn", "kv_store", {{"message", line}});
  });
  // Gauges follow the engine's state; sampled, not pushed, to keep the
  // scheduler thread free of metrics work.
  std::atomic<bool> stop_gauges{false};
  std::thread gauges([&] {
    while (!stop_gauges.load()) {
      const engine::EngineStats st = (*engine)->stats();
      metrics.SetKvCache(st.kv_usage_ratio, st.kv_blocks_free);
      metrics.SetPrefixCache(st.prefix_cache_usage_ratio);
      const engine::KvStoreStats kv = (*engine)->kv_store_stats();
      metrics.SetKvStoreTotals(
          {kv.read_hits, kv.read_misses, kv.writes, kv.bytes_read, kv.bytes_written, kv.errors});
      metrics.SetRequests(st.running, st.waiting);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  service.SetReady(engine->get());
  openai.SetReady(engine->get());
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  const auto& info = (*engine)->model();
  LogEvent(
      "info", "serving",
      {{"model", config.engine.model_path},
       {"model_id", info.model_id},
       {"layers", info.num_layers},
       {"kv_cache_tokens", info.kv_cache_capacity_tokens},
       {"load_s",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count()}});

  int signal = 0;
  sigwait(&signals, &signal);
  LogEvent("info", "draining",
           {{"signal", signal == SIGTERM ? "SIGTERM" : "SIGINT"},
            {"in_flight", service.in_flight().count()},
            {"grace_s", config.shutdown_grace_s}});
  service.SetDraining(true);
  openai.SetDraining(true);
  health->SetServingStatus(false);
  const bool idle = service.in_flight().WaitIdle(config.shutdown_grace_s);
  // Calls still running after the grace end with UNAVAILABLE from the
  // engine's shutdown; Shutdown's deadline then cancels anything left.
  (*engine)->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (http_server) http_server->Stop();
  stop_gauges.store(true);
  gauges.join();
  service.SetReady(nullptr);
  openai.SetReady(nullptr);
  LogEvent("info", "stopped", {{"drained", idle}});
  return 0;
}

}  // namespace
}  // namespace snapserve::server

int main(int argc, char** argv) {
  using namespace snapserve::server;
  const ParseResult parsed = ParseServerConfig(std::vector<std::string>(argv + 1, argv + argc));
  if (parsed.exit) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  InitLogging(parsed.config.log_level);
  for (const std::string& w : parsed.warnings)
    LogEvent("warn", "deprecated_flag", {{"message", w}});
  return Run(parsed.config);
}
