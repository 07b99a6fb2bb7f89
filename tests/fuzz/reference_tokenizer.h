// The tokenizer the encode/decode harnesses run: the default model's
// (SmolLM2's byte-level BPE, 49152 tokens, from its GGUF) when the model has
// been fetched, else the reduced SmolLM2 tokenizer files of the
// tokenizer_files seed corpus. SNAPSERVE_FUZZ_TOKENIZER overrides both (a
// .gguf file or a Hugging Face directory).
#pragma once

#include "engine/tokenizer/tokenizer.h"

namespace snapserve::fuzz {

// Loaded on first use; aborts when no tokenizer can be loaded.
const tokenizer::Tokenizer& ReferenceTokenizer();

}  // namespace snapserve::fuzz
