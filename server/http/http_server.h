// The HTTP/1.1 listener of the OpenAI-compatible API (--http-port), on
// Boost.Beast and Boost.Asio (docs/api.md, "Why Boost.Beast").
//
// A few I/O threads (std::thread, so normal stacks: civetweb's small ones
// were what failed in a LibTorch process, server/metrics_http.h) run every
// connection; each connection's work runs on its own strand. Requests are
// parsed by Beast with a bounded head and body, and handed to a Handler with
// an HttpResponder. The responder may be used from any thread (the engine's
// scheduler thread included): it only posts to the connection's strand, so
// nothing here ever blocks the caller. Plain TCP or TLS (the gRPC port's
// certificate, key and optional client CA). Keep-alive; one request at a
// time per connection. While a response is pending the connection watches
// for the client going away and tells the handler (a disconnect cancels
// generation).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace snapserve::server::http {

struct HttpRequest {
  std::string method;
  std::string path;           // the target without its query
  std::string authorization;  // the Authorization header, or ""
  std::string traceparent;    // the W3C traceparent header, or ""
  std::string body;
};

class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // Runs `task` on the connection's strand: where the calls below act.
  // Every method may be called from any thread; each posts its work.
  virtual void Post(std::function<void()> task) = 0;
  // A whole response. `extra_headers`: lines ending in "\r\n".
  virtual void Reply(int status, std::string content_type, std::string body,
                     std::string extra_headers = {}) = 0;
  // A server-sent-events response (200, text/event-stream, chunked): Event
  // writes "data: <data>\n\n", EndEvents ends the response.
  virtual void StartEvents() = 0;
  virtual void Event(std::string data) = 0;
  virtual void EndEvents() = 0;
  // `on_gone` runs once, on the strand, when the client disconnects (or a
  // write fails) before the response has ended; never after it ended.
  virtual void OnClientGone(std::function<void()> on_gone) = 0;
};

struct HttpServerOptions {
  std::string host;  // numeric address or name; IPv6 may be in brackets
  int port = 0;      // 0 picks a free port
  // TLS when tls_cert is set (PEM files), mutual TLS when tls_client_ca is too.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  size_t max_body_bytes = 16 << 20;  // a larger body is answered 413
  size_t max_head_bytes = 16 << 10;  // a larger head is answered 431
  int io_threads = 2;
  int max_connections = 1024;  // beyond it, new connections are closed at once
  // A request's head and body must arrive within it; an idle keep-alive
  // connection is closed after it.
  std::chrono::seconds request_timeout{30};
};

class HttpServer {
 public:
  // Called on the connection's strand for each complete request.
  using Handler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

  HttpServer(HttpServerOptions options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Returns "" or an error.
  std::string Start();
  // "host:port" as bound, IPv6 in brackets.
  const std::string& address() const;
  int port() const;
  // Closes the listener and every connection; joins the I/O threads.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace snapserve::server::http
