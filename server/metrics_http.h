// A minimal HTTP/1.1 server for GET /metrics (Prometheus text format).
//
// Why not prometheus-cpp's Exposer (civetweb): civetweb asks for small
// thread stacks, and glibc carves static TLS out of the requested stack. With
// LibTorch loaded (MKL, oneDNN, cuBLASLt all keep large static TLS) civetweb's
// workers either fail to start or overflow their stack on the first scrape.
// This server runs on one std::thread with a normal stack, serializes with
// prometheus-cpp's TextSerializer, and answers one short request at a time,
// which is all a scraper needs.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace snapserve::server {

class MetricsHttpServer {
 public:
  // `render` produces the exposition text on each scrape.
  explicit MetricsHttpServer(std::function<std::string()> render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds host:port (port 0 picks one) and starts serving. `host` is a
  // numeric IPv4 or IPv6 address (brackets allowed, as gRPC's --host takes
  // them) or a name that resolves to one. Returns "" or an error.
  std::string Start(const std::string& host, int port);
  int port() const { return port_; }
  // The bound address as "host:port", IPv6 in brackets.
  const std::string& address() const { return address_; }
  void Stop();

 private:
  void Serve();
  void HandleConnection(int fd);

  std::function<std::string()> render_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace snapserve::server
