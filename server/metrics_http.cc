#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <list>
#include <memory>
#include <optional>
#include <vector>

#include "server/http_request_head.h"

namespace snapserve::server {
namespace {

// How often the loop wakes up with nothing to do, to notice Stop().
constexpr std::chrono::milliseconds kStopCheck{200};

// RFC 9110, 6.6.1: an origin server with a clock sends Date.
std::string HttpDate() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[64];
  std::strftime(text, sizeof(text), "%a, %d %b %Y %H:%M:%S GMT", &utc);
  return text;
}

// A HEAD answer carries the headers a GET would (Content-Length included)
// and no body (RFC 9110, 9.3.2): a client reading the body it announces would
// otherwise take it for the next response.
std::string Response(int code, const char* reason, const std::string& type, const std::string& body,
                     bool head, const std::string& extra_headers = "") {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nDate: " + HttpDate() +
         "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "Connection: close\r\n\r\n" + (head ? std::string() : body);
}

}  // namespace

// One client socket and where its exchange stands: reading the request head,
// sending the answer, then draining (see Write) until the client closes.
class MetricsHttpServer::Connection {
 public:
  enum class Phase { kReadingHead, kSending, kDraining, kDone };

  Connection(int fd, Clock::time_point now, const MetricsHttpLimits& limits)
      : fd_(fd),
        limits_(limits),
        head_deadline_(now + limits.head_timeout),
        idle_deadline_(now + limits.idle_timeout) {}
  ~Connection() { close(fd_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  Phase phase() const { return phase_; }
  PollEvents events() const { return phase_ == Phase::kSending ? POLLOUT : POLLIN; }
  Clock::time_point deadline() const {
    return phase_ == Phase::kReadingHead ? std::min(head_deadline_, idle_deadline_)
                                         : idle_deadline_;
  }
  // The complete head, once Read returned true and the head was not too large.
  std::optional<std::string_view> head() const {
    if (head_length_ == 0 || head_length_ > limits_.max_head_bytes) return std::nullopt;
    return std::string_view(received_).substr(0, head_length_);
  }

  // Takes what has arrived. Returns true when there is something to answer:
  // the head is complete, or it outgrew max_head_bytes (head() is then empty).
  bool Read(Clock::time_point now) {
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      if (n <= 0) {  // closed by the client, or failed: nothing left to do
        phase_ = Phase::kDone;
        return false;
      }
      if (phase_ != Phase::kReadingHead) continue;  // draining: discard
      idle_deadline_ = now + limits_.idle_timeout;
      received_.append(buf, static_cast<size_t>(n));
      head_length_ = HttpHeadLength(received_);
      if (head_length_ > 0 || received_.size() > limits_.max_head_bytes) return true;
    }
  }

  void Send(std::string response, Clock::time_point now) {
    out_ = std::move(response);
    phase_ = Phase::kSending;
    idle_deadline_ = now + limits_.idle_timeout;
    Write(now);
  }

  // Sends what the socket takes now.
  void Write(Clock::time_point now) {
    while (sent_ < out_.size()) {
      const ssize_t n = send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        phase_ = Phase::kDone;
        return;
      }
      sent_ += static_cast<size_t>(n);
      idle_deadline_ = now + limits_.idle_timeout;
    }
    // Closing a socket with unread request bytes in it makes the kernel reset
    // the connection, and a reset can destroy the answer before the client
    // reads it (an oversized head's 431, say). So: half-close, then read and
    // discard until the client closes, for one idle_timeout at most.
    shutdown(fd_, SHUT_WR);
    phase_ = Phase::kDraining;
    idle_deadline_ = now + limits_.idle_timeout;
    out_ = std::string();
  }

  void Close() { phase_ = Phase::kDone; }

 private:
  const int fd_;
  const MetricsHttpLimits& limits_;
  Phase phase_ = Phase::kReadingHead;
  const Clock::time_point head_deadline_;
  Clock::time_point idle_deadline_;
  std::string received_;
  size_t head_length_ = 0;
  std::string out_;
  size_t sent_ = 0;
};

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render, MetricsHttpLimits limits)
    : render_(std::move(render)), limits_(limits) {}

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
  listen_fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return std::string("socket: ") + std::strerror(errno);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, found->ai_addr, found->ai_addrlen) != 0 ||
      listen(listen_fd_, SOMAXCONN) != 0) {
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
  if (thread_.joinable()) thread_.join();  // Serve closes its connections on the way out
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsHttpServer::Serve() {
  std::list<Connection> connections;  // oldest first: the one a newcomer beyond the cap evicts
  std::vector<pollfd> polled;
  Clock::time_point accept_paused_until;
  while (!stop_.load()) {
    Clock::time_point now = Clock::now();
    Clock::time_point wake = now + kStopCheck;
    polled.clear();
    const bool accepting = now >= accept_paused_until;
    polled.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // fd -1: skipped by poll
    for (const Connection& c : connections) {
      polled.push_back({c.fd(), c.events(), 0});
      wake = std::min(wake, c.deadline());
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    if (poll(polled.data(), polled.size(), static_cast<int>(std::max<int64_t>(0, wait))) < 0) {
      if (errno == EINTR) continue;
      break;  // EFAULT/EINVAL/ENOMEM: nothing sensible left to do
    }
    now = Clock::now();
    size_t i = 1;
    for (Connection& c : connections) Advance(c, polled[i++].revents, now);
    connections.remove_if(
        [](const Connection& c) { return c.phase() == Connection::Phase::kDone; });
    if (accepting && (polled[0].revents & POLLIN) && !AcceptPending(connections, now)) {
      accept_paused_until = now + kStopCheck;
    }
  }
}

void MetricsHttpServer::Advance(Connection& c, PollEvents revents, Clock::time_point now) const {
  const bool reading =
      c.phase() == Connection::Phase::kReadingHead || c.phase() == Connection::Phase::kDraining;
  if (reading && (revents & (POLLIN | POLLHUP | POLLERR)) && c.Read(now)) {
    const std::optional<std::string_view> head = c.head();
    c.Send(head ? Answer(*head)
                : Response(431, "Request Header Fields Too Large", "text/plain",
                           "request head longer than " + std::to_string(limits_.max_head_bytes) +
                               " bytes\n",
                           false),
           now);
  }
  if ((revents & POLLOUT) && c.phase() == Connection::Phase::kSending) c.Write(now);
  // A head still incomplete at its deadline gets no answer: whoever sends so
  // slowly is not a scraper.
  if (now >= c.deadline()) c.Close();
}

bool MetricsHttpServer::AcceptPending(std::list<Connection>& connections,
                                      Clock::time_point now) const {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (connections.size() >= static_cast<size_t>(limits_.max_connections)) {
        connections.pop_front();
      }
      connections.emplace_back(fd, now, limits_);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE) {
      // Out of descriptors: free one of ours if we hold any; otherwise the
      // caller stops polling the backlog for a while rather than spin on it.
      if (connections.empty()) return false;
      connections.pop_front();
      continue;
    }
    return true;  // EAGAIN: nothing more to accept now
  }
}

std::string MetricsHttpServer::Answer(std::string_view head) const {
  const std::optional<HttpRequestLine> line = ParseHttpRequestLine(head);
  if (!line) {
    return Response(400, "Bad Request", "text/plain", "malformed request line\n", false);
  }
  const bool is_head = line->method == "HEAD";
  if (line->method != "GET" && !is_head) {
    return Response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false,
                    "Allow: GET, HEAD\r\n");
  }
  const std::string& path = line->target;
  if (path == "/metrics" || path.rfind("/metrics?", 0) == 0) {
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render_(), is_head);
  }
  if (path == "/" || path == "/healthz") return Response(200, "OK", "text/plain", "ok\n", is_head);
  return Response(404, "Not Found", "text/plain", "see /metrics\n", is_head);
}

}  // namespace snapserve::server
