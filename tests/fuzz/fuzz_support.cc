#include "tests/fuzz/fuzz_support.h"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The replacements of ::mmap / ::munmap for the parsers (tests/fuzz/heap_mmap.h).
void* SnapserveFuzzMmap(void* /*addr*/, size_t length, int /*prot*/, int /*flags*/, int fd,
                        off_t offset) {
  auto* buf = static_cast<char*>(std::malloc(length == 0 ? 1 : length));
  if (buf == nullptr) return MAP_FAILED;
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, buf + done, length - done, offset + static_cast<off_t>(done));
    if (n <= 0) {
      std::free(buf);
      errno = n == 0 ? EIO : errno;
      return MAP_FAILED;
    }
    done += static_cast<size_t>(n);
  }
  return buf;
}

int SnapserveFuzzMunmap(void* addr, size_t /*length*/) {
  std::free(addr);
  return 0;
}

namespace snapserve::fuzz {

InputFile::InputFile() : fd_(::memfd_create("snapserve-fuzz-input", MFD_CLOEXEC)) {
  Check(fd_ >= 0, "memfd_create failed");
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::Write(const uint8_t* data, size_t size) {
  Check(::ftruncate(fd_, 0) == 0, "ftruncate failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
    Check(n > 0, "pwrite failed");
    done += static_cast<size_t>(n);
  }
}

InputDirectory::InputDirectory() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/snapserve-fuzz-XXXXXX";
  Check(::mkdtemp(templ.data()) != nullptr, "mkdtemp failed");
  path_ = templ;
}

InputDirectory::~InputDirectory() {
  for (const std::string& name : names_) ::unlink((path_ + "/" + name).c_str());
  ::rmdir(path_.c_str());
}

void InputDirectory::WriteFile(const std::string& name, const std::string_view* contents) {
  const std::string path = path_ + "/" + name;
  if (contents == nullptr) {
    ::unlink(path.c_str());
    return;
  }
  if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
  FILE* f = std::fopen(path.c_str(), "wb");
  Check(f != nullptr, "cannot write into the input directory");
  Check(std::fwrite(contents->data(), 1, contents->size(), f) == contents->size(),
        "short write into the input directory");
  std::fclose(f);
}

std::vector<std::string_view> SplitOnNul(const uint8_t* data, size_t size, size_t max_parts) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  parts.push_back(rest);
  return parts;
}

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}

}  // namespace snapserve::fuzz
