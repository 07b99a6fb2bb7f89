#include "engine/tokenizer/byte_level_bpe.h"

#include <queue>

#include "engine/tokenizer/unicode.h"

namespace snapserve::tokenizer {
namespace {

bool SelfMapped(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// 68 bytes are not self-mapped; they take the code points 256..323.
constexpr uint32_t kMaxMappedCodePoint = 256 + 68;

struct ByteTable {
  uint32_t to_cp[256];
  int16_t from_cp[kMaxMappedCodePoint];
  ByteTable() {
    uint32_t next = 256;
    for (uint32_t cp = 0; cp < kMaxMappedCodePoint; ++cp) from_cp[cp] = -1;
    for (uint32_t b = 0; b < 256; ++b) {
      to_cp[b] = SelfMapped(b) ? b : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTable& Table() {
  static const ByteTable table;
  return table;
}

}  // namespace

uint32_t ByteToCodePoint(uint8_t byte) { return Table().to_cp[byte]; }

int ByteFromCodePoint(uint32_t cp) { return cp < kMaxMappedCodePoint ? Table().from_cp[cp] : -1; }

StatusOr<ByteLevelBpe> ByteLevelBpe::Create(
    std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
    bool ignore_merges) {
  ByteLevelBpe bpe;
  bpe.tokens_ = std::move(tokens);
  bpe.ignore_merges_ = ignore_merges;
  bpe.ids_.reserve(bpe.tokens_.size());
  for (size_t i = 0; i < bpe.tokens_.size(); ++i) {
    // On a duplicate text the first id wins, as in a vocab map.
    bpe.ids_.emplace(bpe.tokens_[i], static_cast<int32_t>(i));
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(b)), &s);
    bpe.byte_ids_[b] = bpe.Find(s);
  }
  bpe.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    int32_t ia = bpe.Find(a), ib = bpe.Find(b), ir = bpe.Find(a + b);
    if (ia < 0 || ib < 0 || ir < 0) {
      std::string msg = "BPE merge " + std::to_string(rank) + " ('";
      msg.append(a).append(" ").append(b).append("') uses a token missing from the vocabulary");
      return Status::InvalidArgument(msg);
    }
    // A repeated pair keeps its first (highest-priority) rank.
    bpe.merges_.emplace(PairKey(ia, ib), Merge{static_cast<int32_t>(rank), ir});
  }
  return bpe;
}

int32_t ByteLevelBpe::Find(std::string_view text) const {
  auto it = ids_.find(std::string(text));
  return it == ids_.end() ? -1 : it->second;
}

std::string ByteLevelBpe::TokenBytes(int32_t id) const {
  const std::string& text = token(id);
  std::string bytes;
  for (const CodeUnit& u : DecodeUtf8(text)) {
    int b = u.cp == kInvalidCodePoint ? -1 : ByteFromCodePoint(u.cp);
    if (b < 0) return text;
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

void ByteLevelBpe::Encode(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    std::string mapped;
    for (unsigned char c : piece) AppendUtf8(ByteToCodePoint(c), &mapped);
    if (int32_t id = Find(mapped); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  // Symbols form a doubly linked list; a min-heap of candidate merges ordered
  // by (rank, position) applies the best merge first, leftmost on ties, like
  // HF tokenizers' Word::merge_all. Stale heap entries are skipped on pop.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  for (unsigned char c : piece) {
    int32_t id = byte_ids_[c];
    if (id < 0) continue;  // a byte missing from the vocabulary: no unk token to use
    int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merges_.find(PairKey(sym[pos].id, sym[sym[pos].next].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.result});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);

  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& s = sym[c.pos];
    if (s.id < 0 || s.next < 0) continue;
    auto it = merges_.find(PairKey(s.id, sym[s.next].id));
    if (it == merges_.end() || it->second.rank != c.rank) continue;  // stale
    int32_t gone = s.next;
    s.id = c.result;
    s.next = sym[gone].next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    sym[gone].id = -1;
    push(s.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

}  // namespace snapserve::tokenizer
