// The layout tuning's cache, a tune.json read by read_layout_choice (src/tune/layout_tune.cpp),
// and the JSON reader under it (src/core/json.cpp, nlohmann's parser with its checks): a parsed
// value must dump and parse back to the same text; and the `--batch auto` cache, read by
// read_tune_choice (src/tune/tune_report.cpp).
#include <optional>

#include "core/json.h"
#include "fuzz_util.h"
#include "plan/planner.h"
#include "tune/layout_tune.h"
#include "tune/tune.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<sat::JsonRef> j;
  if (sat::fuzz::accepts([&] { j = sat::JsonRef::parse(text, "tune.json"); })) {
    const std::string dumped = j->value().dump(2);
    std::optional<sat::JsonRef> again;
    sat::fuzz::require(sat::fuzz::accepts([&] { again = sat::JsonRef::parse(dumped); }), "dump parses back");
    sat::fuzz::require(again->value().dump(2) == dumped, "dump round-trips");
    sat::fuzz::require(sat::fuzz::accepts([&] { again = sat::JsonRef::parse(j->value().dump()); }) &&
                           again->value().dump(2) == dumped,
                       "dump(-1) round-trips");
  }
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("tune.json");
  sat::fuzz::write_file(path, text);
  sat::Layout l;
  double measured = 0, predicted = 0;
  bool ok = false;
  sat::fuzz::accepts([&] { ok = sat::read_layout_choice(path, l, measured, predicted); });
  if (ok) {
    (void)l.str();
    (void)sat::layout_choice_line(l, measured, predicted);
  }
  sat::TuneChoice c;
  if (sat::fuzz::accepts([&] { c = sat::read_tune_choice(path, 1 << 24, 4096); })) {
    sat::fuzz::require(c.micro_batch >= 1 && c.micro_batch <= (1 << 24) && c.accum >= 1 && c.lr > 0 &&
                           c.zero >= 0 && c.zero <= 3 && c.global_batch == c.micro_batch * c.accum * 4096,
                       "read_tune_choice returns only values a flag allows");
  }
  return 0;
}
