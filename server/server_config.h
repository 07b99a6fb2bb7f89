// The server's configuration: every flag of `snapserve`, its default, and its
// help text. Flags come from the command line (`--kv-cache-memory=2GiB`) or,
// for Kubernetes, from environment variables named SNAPSERVE_<FLAG>
// (SNAPSERVE_KV_CACHE_MEMORY=2GiB); the command line wins.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace snapserve::server {

struct ServerConfig {
  // Network.
  std::string host = "0.0.0.0";
  int port = 50051;
  int metrics_port = 9464;
  int64_t max_message_bytes = 16 << 20;
  std::string tls_cert;       // PEM file; enables TLS together with tls_key
  std::string tls_key;        // PEM file
  std::string tls_client_ca;  // PEM file; when set, clients must present a certificate it signed
  double shutdown_grace_s = 30;

  // Model.
  std::string model;  // .gguf file or Hugging Face directory
  std::string model_id;
  std::string dtype = "float32";
  std::string device = "cpu";

  // Engine limits.
  int64_t kv_cache_memory = int64_t{2} << 30;  // bytes
  int block_size = 16;
  int max_batch_size = 16;
  int max_queue = 256;
  int max_new_tokens_limit = 4096;
  int default_max_new_tokens = 256;
  int threads = 0;  // 0: all cores
  // Prefill work between two decode steps while others decode (engine.h).
  int prefill_chunk_tokens = 512;

  // SnapKV defaults (docs/snapkv.md, "Parameters").
  std::string default_kv_method = "snapkv";
  int snapkv_window = 32;
  int snapkv_capacity = 1024;
  int snapkv_kernel = 7;
  std::string snapkv_pooling = "max";

  std::string log_level = "info";
};

// Outcome of parsing: either a config, or a message to print and an exit code
// (0 for --help, 2 for a bad flag).
struct ParseResult {
  ServerConfig config;
  bool exit = false;
  int exit_code = 0;
  std::string message;
};

// Parses argv (and SNAPSERVE_* environment variables through `getenv`).
ParseResult ParseServerConfig(const std::vector<std::string>& args,
                              char* (*getenv_fn)(const char*) = nullptr);

// The --help text: every flag, its environment variable and default.
std::string ServerHelp();

// Parses sizes like "2GiB", "512MiB", "1e9", "1073741824". Returns -1 when invalid.
int64_t ParseByteSize(const std::string& text);

}  // namespace snapserve::server
