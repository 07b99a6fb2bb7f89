// A minimal HTTP/1.1 server for GET /metrics (Prometheus text format).
//
// Why not prometheus-cpp's Exposer (civetweb): civetweb asks for small
// thread stacks, and glibc carves static TLS out of the requested stack. With
// LibTorch loaded (MKL, oneDNN, cuBLASLt all keep large static TLS) civetweb's
// workers either fail to start or overflow their stack on the first scrape.
//
// One std::thread (normal stack) runs a poll() loop over non-blocking sockets,
// so a slow or idle client never delays another: a scrape is answered as soon
// as its request head is in, whatever else is connected. Every connection is
// bounded in time (the head must arrive within head_timeout; no progress for
// idle_timeout closes it), in memory (max_head_bytes) and in number
// (max_connections). Each answer closes its connection (Connection: close).
#pragma once

#include <poll.h>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <string>
#include <thread>

namespace snapserve::server {

// The event bits poll() takes and reports (pollfd::events, a short).
using PollEvents = decltype(pollfd::events);

// The defaults are the documented limits (docs/metrics.md, "Endpoint").
struct MetricsHttpLimits {
  // Open connections at most. A new connection beyond it closes the oldest
  // one, not the new one: a flood of idle connections then cannot lock a
  // scraper out, since a scraper sends its request at once and is answered
  // before it becomes the oldest.
  int max_connections = 256;
  // A longer request head is answered 431. A scrape's is a few hundred bytes.
  size_t max_head_bytes = 8192;
  // From accept to the end of the request head, in total: a client sending a
  // byte now and then (slow loris) is cut off at this point, not kept alive.
  std::chrono::milliseconds head_timeout{5000};
  // Longest time without a byte moving either way before the connection is
  // closed (a client that connects and says nothing, or does not read).
  std::chrono::milliseconds idle_timeout{2000};
};

class MetricsHttpServer {
 public:
  // `render` produces the exposition text on each scrape.
  explicit MetricsHttpServer(std::function<std::string()> render, MetricsHttpLimits limits = {});
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
  // Closes every connection and the listening socket; joins the thread.
  void Stop();

 private:
  using Clock = std::chrono::steady_clock;
  class Connection;
  void Serve();
  // Reads, answers, writes or times out `c` after poll() reported `revents`.
  void Advance(Connection& c, PollEvents revents, Clock::time_point now) const;
  // Accepts the backlog; false when out of descriptors with none to free.
  bool AcceptPending(std::list<Connection>& connections, Clock::time_point now) const;
  // The whole response to a complete request head.
  std::string Answer(std::string_view head) const;

  std::function<std::string()> render_;
  MetricsHttpLimits limits_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace snapserve::server
