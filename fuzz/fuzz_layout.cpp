// --layout strings through parse_layout (src/plan/planner.cpp). An accepted string must
// print (filter_str) and its printed form must parse back to the same filter.
#include <string>

#include "fuzz_util.h"
#include "plan/planner.h"
#include "tune/layout_tune.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string s(reinterpret_cast<const char*>(data), size);
  sat::LayoutFilter f;
  if (!sat::fuzz::accepts([&] { f = sat::parse_layout(s); })) return 0;
  const std::string text = sat::filter_str(f);
  if (f.empty()) return 0;
  sat::LayoutFilter again;
  sat::fuzz::require(sat::fuzz::accepts([&] { again = sat::parse_layout(text); }), "filter_str parses back");
  sat::fuzz::require(sat::filter_str(again) == text, "filter_str round-trips");
  return 0;
}
