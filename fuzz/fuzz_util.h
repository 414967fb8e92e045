// Shared helpers of the fuzz targets (fuzz/fuzz_*.cpp): a unique temporary directory for
// the readers that only take a path, and the rule every target follows: the input goes
// through the real production function; a sat::Error is a clean refusal and fine, anything
// else (a crash, a sanitizer report, another exception escaping) is a bug.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace sat::fuzz {

// mkdtemp under $TMPDIR (or /tmp), removed with everything in it when it goes out of scope.
class TempDir {
 public:
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/sat_fuzz_XXXXXX";
    if (!mkdtemp(tmpl.data())) {
      std::perror("sat fuzz: mkdtemp");
      std::abort();
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), std::streamsize(n));
  if (!f) {
    std::fprintf(stderr, "sat fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}
inline void write_file(const std::string& path, std::string_view s) { write_file(path, s.data(), s.size()); }

// Runs f; a sat::Error is a clean refusal (returns false). Other exceptions escape to the
// fuzzer, which reports them as a crash (an uncaught exception is a bug).
template <typename F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const sat::Error&) {
    return false;
  }
}

// A property every accepted input must have; a violation aborts (the fuzzer saves the input).
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "sat fuzz: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace sat::fuzz
