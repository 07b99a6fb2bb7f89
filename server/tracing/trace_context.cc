#include "server/tracing/trace_context.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <random>

namespace snapserve::server::tracing {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is invalid in traceparent
}

// Decodes exactly out.size() bytes of lowercase hex from `text`.
template <size_t N>
bool DecodeHex(std::string_view text, std::array<uint8_t, N>& out) {
  if (text.size() != 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexValue(text[2 * i]);
    const int lo = HexValue(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <size_t N>
std::string EncodeHex(const std::array<uint8_t, N>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * N, '0');
  for (size_t i = 0; i < N; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

void FillRandom(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = getrandom(out + done, n - done, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
    } else if (got < 0 && errno != EINTR) {
      break;  // no getrandom: the library's own nondeterministic source
    }
  }
  if (done == n) return;
  thread_local std::random_device device;
  for (; done < n; ++done) out[done] = static_cast<uint8_t>(device());
}

template <size_t N>
std::array<uint8_t, N> NewId() {
  std::array<uint8_t, N> id{};
  do {
    FillRandom(id.data(), id.size());
  } while (std::all_of(id.begin(), id.end(), [](uint8_t b) { return b == 0; }));
  return id;
}

std::string_view Trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<TraceParent> ParseTraceParent(std::string_view header) {
  // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55.
  constexpr size_t kLength = 55;
  const std::string_view s = Trim(header);
  if (s.size() < kLength) return std::nullopt;
  std::array<uint8_t, 1> version{};
  if (!DecodeHex(s.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  // Version 00 has exactly these fields; a later one may add fields after them.
  if (version[0] == 0 ? s.size() != kLength : (s.size() > kLength && s[kLength] != '-')) {
    return std::nullopt;
  }
  if (s[2] != '-' || s[35] != '-' || s[52] != '-') return std::nullopt;
  TraceParent p;
  std::array<uint8_t, 1> flags{};
  if (!DecodeHex(s.substr(3, 32), p.trace_id) || !DecodeHex(s.substr(36, 16), p.span_id) ||
      !DecodeHex(s.substr(53, 2), flags)) {
    return std::nullopt;
  }
  if (IsZero(p.trace_id) || IsZero(p.span_id)) return std::nullopt;
  p.flags = flags[0];
  return p;
}

TraceId NewTraceId() { return NewId<16>(); }
SpanId NewSpanId() { return NewId<8>(); }

bool IsZero(const TraceId& id) {
  return std::all_of(id.begin(), id.end(), [](uint8_t b) { return b == 0; });
}
bool IsZero(const SpanId& id) {
  return std::all_of(id.begin(), id.end(), [](uint8_t b) { return b == 0; });
}

std::string ToHex(const TraceId& id) { return EncodeHex(id); }
std::string ToHex(const SpanId& id) { return EncodeHex(id); }

}  // namespace snapserve::server::tracing
