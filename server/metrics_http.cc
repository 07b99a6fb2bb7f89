#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace snapserve::server {
namespace {

constexpr size_t kMaxRequestBytes = 8192;  // a scrape's request is a few hundred bytes
constexpr int kIoTimeoutMs = 2000;

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    sent += static_cast<size_t>(n);
  }
}

// A HEAD answer carries the headers a GET would (Content-Length included)
// and no body (RFC 9110, 9.3.2): a client reading the body it announces would
// otherwise take it for the next response.
std::string Response(int code, const char* reason, const std::string& type, const std::string& body,
                     bool head) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         (head ? std::string() : body);
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render)
    : render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

std::string MetricsHttpServer::Start(const std::string& host, int port) {
  // "[::1]" as gRPC spells an IPv6 host; getaddrinfo wants it bare.
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(name.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return "cannot resolve " + host + ": " + gai_strerror(rc);
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  listen_fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return std::string("socket: ") + std::strerror(errno);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, found->ai_addr, found->ai_addrlen) != 0 || listen(listen_fd_, 64) != 0) {
    const std::string err = std::strerror(errno);
    close(listen_fd_);
    listen_fd_ = -1;
    return "cannot listen on " + host + ":" + service + ": " + err;
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  char text[INET6_ADDRSTRLEN] = "";
  if (bound.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&bound);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port_ = ntohs(a->sin6_port);
    address_ = "[" + std::string(text) + "]:" + std::to_string(port_);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&bound);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port_ = ntohs(a->sin_port);
    address_ = std::string(text) + ":" + std::to_string(port_);
  }
  thread_ = std::thread([this] { Serve(); });
  return "";
}

void MetricsHttpServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsHttpServer::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    // Wake up regularly to notice Stop().
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    HandleConnection(fd);
    close(fd);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  std::string request;
  char buf[1024];
  // Read until the end of the headers, a size cap or a timeout: a slow or
  // hostile client cannot hold the thread or make it allocate without bound.
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kIoTimeoutMs) <= 0) return;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const bool head = line.rfind("HEAD ", 0) == 0;
  if (line.rfind("GET ", 0) != 0 && !head) {
    SendAll(fd, Response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false));
    return;
  }
  const size_t path_start = line.find(' ') + 1;
  const std::string path = line.substr(path_start, line.find(' ', path_start) - path_start);
  if (path == "/metrics" || path.rfind("/metrics?", 0) == 0) {
    SendAll(fd, Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render_(), head));
  } else if (path == "/" || path == "/healthz") {
    SendAll(fd, Response(200, "OK", "text/plain", "ok\n", head));
  } else {
    SendAll(fd, Response(404, "Not Found", "text/plain", "see /metrics\n", head));
  }
}

}  // namespace snapserve::server
