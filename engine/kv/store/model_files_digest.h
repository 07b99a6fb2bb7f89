// A digest of a model's files by content, the same on every machine that
// holds the same files wherever they are mounted: the prefix cache's
// fingerprint (engine.cc, ModelFingerprint) names chunks with it, so two
// replicas share chunks through a store exactly when they serve the same
// weights. Bounded reads, never the whole file: each file's size, its first
// kHeadBytes (a GGUF's header and metadata, a safetensors header, all of a
// config.json) and kSamples windows of kSampleBytes spread evenly over the
// rest, the last window ending at the file's end.
#pragma once

#include <cstdint>
#include <string>

#include "engine/common/status_or.h"

namespace snapserve::kv {

inline constexpr int64_t kDigestHeadBytes = int64_t{4} << 20;
inline constexpr int64_t kDigestSamples = 32;
inline constexpr int64_t kDigestSampleBytes = int64_t{64} << 10;

// `path`: a model file, or a directory whose visible regular files (not
// those in subfolders) are digested in name order, each under its name.
StatusOr<uint64_t> ModelFilesDigest(const std::string& path);

}  // namespace snapserve::kv
