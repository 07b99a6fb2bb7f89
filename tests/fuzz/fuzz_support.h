// What the libFuzzer harnesses (tests/fuzz/*_fuzzer.cc) share: handing the
// input to parsers that open files by path, and splitting one input into the
// parts of a multi-part target. README.md, "Fuzzing".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace snapserve::fuzz {

// A file whose contents are replaced by each call (one memfd per process,
// so nothing touches the disk); Path() opens it like any regular file.
class InputFile {
 public:
  InputFile();
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  void Write(const uint8_t* data, size_t size);
  const std::string& Path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// A private directory for this process, removed at exit; WriteFile() writes
// or (with nullptr) removes one file in it.
class InputDirectory {
 public:
  InputDirectory();
  ~InputDirectory();
  InputDirectory(const InputDirectory&) = delete;
  InputDirectory& operator=(const InputDirectory&) = delete;
  void WriteFile(const std::string& name, const std::string_view* contents);
  const std::string& Path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> names_;
};

// The parts of a multi-part input: the bytes between NUL bytes (`max_parts`
// at most; the last part keeps any further NULs). The seeds write text
// files joined by NULs, which no valid JSON or template text contains.
std::vector<std::string_view> SplitOnNul(const uint8_t* data, size_t size, size_t max_parts);

// Aborts (a finding) with `what` when `ok` is false: for properties the
// parsers promise beyond not crashing.
void Check(bool ok, const char* what);

}  // namespace snapserve::fuzz
