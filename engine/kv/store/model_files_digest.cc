#include "engine/kv/store/model_files_digest.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "engine/kv/prefix_cache.h"

namespace snapserve::kv {

namespace {

namespace fs = std::filesystem;

// Appends the bytes of `file` at [offset, offset + size) to `out`.
bool ReadRange(std::ifstream& in, int64_t offset, int64_t size, std::string* out) {
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(size));
  in.seekg(offset);
  in.read(out->data() + at, size);
  return in.gcount() == size;
}

StatusOr<std::string> FileSample(const fs::path& file) {
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(file, ec));
  if (ec) return Status::InvalidArgument(file.string() + ": " + ec.message());
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::InvalidArgument(file.string() + ": cannot open");
  std::string sample = "size=" + std::to_string(size) + "|";
  const int64_t head = std::min(size, kDigestHeadBytes);
  bool ok = ReadRange(in, 0, head, &sample);
  const int64_t rest = size - head;
  if (ok && rest > 0) {
    const int64_t window = std::min(rest, kDigestSampleBytes);
    // Window i starts at head + i * (rest - window) / (samples - 1): the
    // first right after the head, the last ending at the file's end.
    for (int64_t i = 0; ok && i < kDigestSamples; ++i) {
      const int64_t start = head + i * (rest - window) / (kDigestSamples - 1);
      ok = ReadRange(in, start, window, &sample);
    }
  }
  if (!ok) return Status::InvalidArgument(file.string() + ": short read");
  return sample;
}

}  // namespace

StatusOr<uint64_t> ModelFilesDigest(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    // A single file is named by its content only: the same GGUF under
    // another name is the same model.
    SNAPSERVE_ASSIGN_OR_RETURN(std::string sample, FileSample(path));
    return StableHash(sample);
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && !name.starts_with(".")) files.push_back(entry.path());
  }
  if (ec) return Status::InvalidArgument(path + ": " + ec.message());
  std::sort(files.begin(), files.end());
  std::string digests;
  for (const fs::path& f : files) {
    SNAPSERVE_ASSIGN_OR_RETURN(std::string sample, FileSample(f));
    digests += f.filename().string() + ":" + std::to_string(StableHash(sample)) + "|";
  }
  return StableHash(digests);
}

}  // namespace snapserve::kv
