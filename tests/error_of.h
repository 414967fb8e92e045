// The message of the sat::Error that f throws, or `accepted` when it throws none.
#pragma once
#include <string>

#include "core/error.h"

namespace sat::test {

template <class F>
std::string error_of(F&& f, const std::string& accepted = "") {
  try {
    f();
  } catch (const sat::Error& e) {
    return e.what();
  }
  return accepted;
}

}  // namespace sat::test
