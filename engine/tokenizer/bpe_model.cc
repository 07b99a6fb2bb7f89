#include "engine/tokenizer/bpe_model.h"

#include "engine/tokenizer/unicode.h"

namespace snapserve::tokenizer {

void ByteLevelBpeModel::Encode(std::string_view text, std::vector<int32_t>* ids) const {
  for (std::string_view piece : PreTokenize(pre_, text)) bpe_.Encode(piece, ids);
}

std::string ByteLevelBpeModel::Text(std::string_view bytes) const { return Utf8Lossy(bytes); }

}  // namespace snapserve::tokenizer
