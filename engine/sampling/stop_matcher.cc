#include "engine/sampling/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace snapserve::sampling {

namespace {

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Length of the longest suffix of `text` that is a proper prefix of `stop`
// (a match that the next text could complete).
size_t partial_suffix(std::string_view text, std::string_view stop) {
  const size_t max_len = std::min(text.size(), stop.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == stop.substr(0, len)) return len;
  }
  return 0;
}

// Bytes at the end of `text` that start a UTF-8 character whose remaining
// bytes have not arrived yet.
size_t incomplete_utf8_tail(std::string_view text) {
  // A character is at most 4 bytes: look back over up to 3 continuation bytes.
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return back < need ? back : 0;
  }
  return 0;  // only continuation bytes: malformed, nothing to wait for
}

}  // namespace

StopMatcher::StopMatcher(StopCriteria criteria) : criteria_(std::move(criteria)) {
  std::erase_if(criteria_.stop, [](const std::string& s) { return s.empty(); });
}

std::optional<FinishReason> StopMatcher::OnToken(int32_t token) {
  ++num_generated_;
  if (contains(criteria_.stop_token_ids, token)) return FinishReason::kStopToken;
  if (!criteria_.ignore_eos && contains(criteria_.eos_token_ids, token)) return FinishReason::kEos;
  if (criteria_.max_new_tokens > 0 && num_generated_ >= criteria_.max_new_tokens) {
    return FinishReason::kLength;
  }
  return std::nullopt;
}

StopMatcher::TextResult StopMatcher::OnText(std::string_view text) {
  TextResult result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  held_.append(text);

  // Earliest occurrence of any stop sequence; on equal starts the shorter one
  // (it completed first). Everything held was already checked against every
  // complete match, so the search could start near the old end; held_ is
  // short (at most the longest stop sequence plus one token), so it doesn't.
  size_t best = std::string::npos;
  for (const std::string& stop : criteria_.stop) {
    const size_t pos = held_.find(stop);
    if (pos == std::string::npos) continue;
    if (pos < best || (pos == best && stop.size() < matched_.size())) {
      best = pos;
      matched_ = stop;
    }
  }
  if (best != std::string::npos) {
    result.emit = held_.substr(0, best);
    result.stopped = true;
    stopped_ = true;
    held_.clear();
    return result;
  }

  size_t hold = incomplete_utf8_tail(held_);
  for (const std::string& stop : criteria_.stop) hold = std::max(hold, partial_suffix(held_, stop));
  result.emit = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopMatcher::Flush() {
  if (stopped_) return {};
  return std::exchange(held_, std::string());
}

}  // namespace snapserve::sampling
