#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace snapserve::tokenizer {

std::string IncrementalDecoder::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) return {};
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  pending_ += tokenizer_.TokenBytes(id);
  // The same leading-space rule as Tokenizer::Decode, applied to the first byte
  // ever decoded: SentencePiece's dummy prefix never reaches the client.
  if (!started_ && !pending_.empty()) {
    started_ = true;
    if (tokenizer_.model().StripsLeadingSpace() && pending_[0] == ' ') pending_.erase(0, 1);
  }
  // Emit everything up to an incomplete trailing sequence. Bytes that can
  // never become valid are emitted (as U+FFFD) at once: the split point is
  // then one where lossy decoding of the parts equals that of the whole
  // (TokenizerModel::Text's contract).
  const std::string_view pending = pending_;
  size_t keep_from = pending.size();
  size_t i = 0;
  while (i < pending.size()) {
    bool incomplete;
    size_t n = ValidSequenceLength(pending.substr(i), &incomplete);
    if (incomplete) {
      keep_from = i;
      break;
    }
    i += n == 0 ? 1 : n;
  }
  std::string out = tokenizer_.model().Text(pending.substr(0, keep_from));
  pending_.erase(0, keep_from);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = tokenizer_.model().Text(pending_);
  pending_.clear();
  return out;
}

}  // namespace snapserve::tokenizer
