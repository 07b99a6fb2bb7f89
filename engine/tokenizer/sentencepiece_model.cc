#include "engine/tokenizer/sentencepiece_model.h"

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "engine/tokenizer/sentencepiece_shim.h"
#include "engine/tokenizer/unicode.h"

#ifndef SNAPSERVE_HAVE_SENTENCEPIECE
#define SNAPSERVE_HAVE_SENTENCEPIECE 0
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
// The module's functions, resolved once per process.
struct SpmApi {
  SnapserveSpmLoadFn load = nullptr;
  SnapserveSpmFreeFn free = nullptr;
  SnapserveSpmSizeFn size = nullptr;
  SnapserveSpmPieceFn piece = nullptr;
  SnapserveSpmFlagsFn flags = nullptr;
  SnapserveSpmPieceToIdFn piece_to_id = nullptr;
  SnapserveSpmSpecialIdFn bos_id = nullptr;
  SnapserveSpmSpecialIdFn eos_id = nullptr;
  SnapserveSpmEncodeFn encode = nullptr;
  std::string error;  // why the module is unusable; empty when it loaded
};

// Where the module is: SNAPSERVE_SENTENCEPIECE_MODULE, else the path CMake
// built it at (binaries use absolute build paths, like their RPATHs).
std::string ModulePath() {
  if (const char* env = std::getenv("SNAPSERVE_SENTENCEPIECE_MODULE"); env && *env) return env;
#ifdef SNAPSERVE_SENTENCEPIECE_MODULE
  return SNAPSERVE_SENTENCEPIECE_MODULE;
#else
  return "libsnapserve_sentencepiece.so";
#endif
}

SpmApi OpenApi() {
  SpmApi api;
  const std::string path = ModulePath();
  int flags = RTLD_NOW | RTLD_LOCAL;
#if !defined(__SANITIZE_ADDRESS__)
  // Bind the module's (and libsentencepiece's) references to their own
  // definitions first: its protobuf copy, not the process's libprotobuf.
  // AddressSanitizer refuses RTLD_DEEPBIND; sanitizer builds go without it.
  flags |= RTLD_DEEPBIND;
#endif
  void* lib = ::dlopen(path.c_str(), flags);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    api.error = "cannot load the SentencePiece module " + path + ": " + (why ? why : "?");
    return api;
  }
  void* fns[std::size(kSnapserveSpmSymbols)] = {};
  for (size_t i = 0; i < std::size(kSnapserveSpmSymbols); ++i) {
    fns[i] = ::dlsym(lib, kSnapserveSpmSymbols[i]);
    if (fns[i] == nullptr) {
      api.error = path + ": missing symbol " + kSnapserveSpmSymbols[i];
      return api;
    }
  }
  // The module stays loaded for the life of the process (never dlclose'd).
  api.load = reinterpret_cast<SnapserveSpmLoadFn>(fns[0]);
  api.free = reinterpret_cast<SnapserveSpmFreeFn>(fns[1]);
  api.size = reinterpret_cast<SnapserveSpmSizeFn>(fns[2]);
  api.piece = reinterpret_cast<SnapserveSpmPieceFn>(fns[3]);
  api.flags = reinterpret_cast<SnapserveSpmFlagsFn>(fns[4]);
  api.piece_to_id = reinterpret_cast<SnapserveSpmPieceToIdFn>(fns[5]);
  api.bos_id = reinterpret_cast<SnapserveSpmSpecialIdFn>(fns[6]);
  api.eos_id = reinterpret_cast<SnapserveSpmSpecialIdFn>(fns[7]);
  api.encode = reinterpret_cast<SnapserveSpmEncodeFn>(fns[8]);
  return api;
}

const SpmApi& Api() {
  static const SpmApi api = OpenApi();
  return api;
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
SentencePieceModel::~SentencePieceModel() {
  if (handle_ != nullptr) Api().free(handle_);
}

bool SentencePieceModel::Available() { return SNAPSERVE_HAVE_SENTENCEPIECE != 0; }

int32_t SentencePieceModel::Find(std::string_view text) const {
  // PieceToId answers unk_id for an unknown piece; check it is really that piece.
  const int id = Api().piece_to_id(handle_, text.data(), text.size());
  if (id >= 0 && id < size() && texts_[static_cast<size_t>(id)] == text) return id;
  return -1;
}

void SentencePieceModel::Encode(std::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  // A first guess of one id per byte is never too small for byte-fallback
  // models; the module says when it is and the call is repeated.
  std::vector<int> out(text.size() + 8);
  int64_t n = Api().encode(handle_, text.data(), text.size(), out.data(), out.size());
  if (n > static_cast<int64_t>(out.size())) {
    out.resize(static_cast<size_t>(n));
    n = Api().encode(handle_, text.data(), text.size(), out.data(), out.size());
  }
  // Fails only on an unloaded model, which Load never returns.
  if (n > 0) ids->insert(ids->end(), out.begin(), out.begin() + n);
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
  const SpmApi& api = Api();
  if (!api.error.empty()) return Status::Internal(path + ": " + api.error);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string proto = buf.str();
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  char err[512] = {};
  m->handle_ = api.load(proto.data(), proto.size(), err, sizeof(err));
  if (m->handle_ == nullptr) {
    return Status::InvalidArgument(path + ": not a valid SentencePiece model (" + err + ")");
  }
  const int n = api.size(m->handle_);
  if (n <= 0) return Status::InvalidArgument(path + ": SentencePiece model has no pieces");
  m->texts_.reserve(static_cast<size_t>(n));
  m->bytes_.reserve(static_cast<size_t>(n));
  m->special_.assign(static_cast<size_t>(n), false);
  std::string piece(256, '\0');
  for (int id = 0; id < n; ++id) {
    size_t len = api.piece(m->handle_, id, piece.data(), piece.size());
    if (len > piece.size()) {
      piece.resize(len);
      len = api.piece(m->handle_, id, piece.data(), piece.size());
    }
    const std::string text = piece.substr(0, len);
    const int flags = api.flags(m->handle_, id);
    const bool special = (flags & 3) != 0;  // control or unknown
    m->texts_.push_back(text);
    // Control and unknown pieces decode to their text, as HF writes added tokens.
    m->bytes_.push_back(special ? text : SentencePieceBytes(text, (flags & 4) != 0));
    m->special_[static_cast<size_t>(id)] = special;
  }
  const int bos = api.bos_id(m->handle_), eos = api.eos_id(m->handle_);
  m->bos_id_ = bos >= 0 && bos < n ? bos : -1;
  m->eos_id_ = eos >= 0 && eos < n ? eos : -1;
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
