// Errors. User mistakes (bad flag, missing or corrupt file, shape mismatch) throw
// sat::Error with a message naming the file/flag and what was expected; the CLI
// prints it and exits with status 2. Broken internal invariants use SAT_ASSERT
// (also an exception, so nothing is lost and no stack trace is printed).
#pragma once
#include <stdexcept>
#include <string>
#include <sstream>

namespace sat {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An error every rank of the job met together and has already printed (one line each):
// the CLI ends with status 2 without printing it again.
struct ReportedError : Error {
  using Error::Error;
};

// Thrown when an allocation would exceed the memory budget (see alloc.h).
struct OutOfMemory : Error {
  using Error::Error;
};

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace sat

#define SAT_CHECK(cond, ...)                        \
  do {                                              \
    if (!(cond)) ::sat::fail(__VA_ARGS__);          \
  } while (0)

#define SAT_ASSERT(cond)                                                        \
  do {                                                                          \
    if (!(cond))                                                                \
      ::sat::fail("internal error: ", #cond, " failed at ", __FILE__, ":", __LINE__); \
  } while (0)
