#include "engine/tokenizer/sentencepiece_model.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/tokenizer/unicode.h"

#ifndef SNAPSERVE_HAVE_SENTENCEPIECE
#define SNAPSERVE_HAVE_SENTENCEPIECE 0
#endif

#if SNAPSERVE_HAVE_SENTENCEPIECE
// Only this file sees the library's header (it declares protobuf-backed types).
#include <sentencepiece_processor.h>
#else
namespace sentencepiece {
class SentencePieceProcessor {};  // so unique_ptr can destroy the (absent) processor
}  // namespace sentencepiece
#endif

namespace snapserve::tokenizer {

namespace {
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 '▁'

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}
}  // namespace

std::string SentencePieceBytes(std::string_view piece, bool is_byte_piece) {
  if (is_byte_piece && piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>') {
    int hi = HexDigit(piece[3]), lo = HexDigit(piece[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
      out.push_back(' ');
      i += kSpaceSymbol.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

SentencePieceModel::SentencePieceModel() = default;
SentencePieceModel::~SentencePieceModel() = default;

bool SentencePieceModel::Available() { return SNAPSERVE_HAVE_SENTENCEPIECE != 0; }

int32_t SentencePieceModel::Find(std::string_view text) const {
#if SNAPSERVE_HAVE_SENTENCEPIECE
  // PieceToId answers unk_id for an unknown piece; check it is really that piece.
  int id = sp_->PieceToId(text);
  if (id >= 0 && id < size() && texts_[static_cast<size_t>(id)] == text) return id;
#else
  (void)text;
#endif
  return -1;
}

void SentencePieceModel::Encode(std::string_view text, std::vector<int32_t>* ids) const {
#if SNAPSERVE_HAVE_SENTENCEPIECE
  if (text.empty()) return;
  std::vector<int> out;
  // Fails only on an unloaded model, which Load never returns.
  sp_->Encode(text, &out).IgnoreError();
  ids->insert(ids->end(), out.begin(), out.end());
#else
  (void)text;
  (void)ids;
#endif
}

std::string SentencePieceModel::Text(std::string_view bytes) const {
  return Utf8LossyPerByte(bytes);
}

StatusOr<std::unique_ptr<SentencePieceModel>> SentencePieceModel::Load(const std::string& path) {
#if !SNAPSERVE_HAVE_SENTENCEPIECE
  return Status::Unimplemented(path +
                               ": SentencePiece tokenizer, but snapserve was built without "
                               "SentencePiece (libsentencepiece-dev was not found at build time)");
#else
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream buf;
  buf << in.rdbuf();
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  m->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  sentencepiece::util::Status st = m->sp_->LoadFromSerializedProto(buf.str());
  if (!st.ok()) {
    return Status::InvalidArgument(path + ": not a valid SentencePiece model (" +
                                   st.error_message() + ")");
  }
  const int n = m->sp_->GetPieceSize();
  if (n <= 0) return Status::InvalidArgument(path + ": SentencePiece model has no pieces");
  m->texts_.reserve(static_cast<size_t>(n));
  m->bytes_.reserve(static_cast<size_t>(n));
  m->special_.assign(static_cast<size_t>(n), false);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = m->sp_->IdToPiece(id);
    const bool special = m->sp_->IsControl(id) || m->sp_->IsUnknown(id);
    m->texts_.push_back(piece);
    // Control and unknown pieces decode to their text, as HF writes added tokens.
    m->bytes_.push_back(special ? piece : SentencePieceBytes(piece, m->sp_->IsByte(id)));
    m->special_[static_cast<size_t>(id)] = special;
  }
  m->bos_id_ = m->sp_->bos_id() < n ? m->sp_->bos_id() : -1;
  m->eos_id_ = m->sp_->eos_id() < n ? m->sp_->eos_id() : -1;
  // The processor does not expose normalizer_spec.add_dummy_prefix; a model
  // with it writes "a" as " a". Decoding then drops that space again.
  std::vector<int32_t> probe;
  m->Encode("a", &probe);
  m->strips_leading_space_ = !probe.empty() && !m->bytes_[static_cast<size_t>(probe[0])].empty() &&
                             m->bytes_[static_cast<size_t>(probe[0])][0] == ' ';
  return m;
#endif
}

}  // namespace snapserve::tokenizer
