// The cluster description file of `--gpu FILE` through hardware() (src/plan/hardware.cpp,
// with the JSON reader of src/core/json.cpp). An accepted file must print
// (hardware_table) and round-trip: hardware_json's text read back gives the same JSON.
#include "fuzz_util.h"
#include "plan/hardware.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("cluster.json");
  sat::fuzz::write_file(path, data, size);
  sat::Hardware h;
  if (!sat::fuzz::accepts([&] { h = sat::hardware(path); })) return 0;
  (void)sat::hardware_table(h);
  std::string json;
  sat::fuzz::require(sat::fuzz::accepts([&] { json = sat::hardware_json(h); }), "an accepted file writes back");
  const std::string again = dir.file("again.json");
  sat::fuzz::write_file(again, json);
  sat::Hardware h2;
  sat::fuzz::require(sat::fuzz::accepts([&] { h2 = sat::hardware(again); }), "hardware_json reads back");
  h2.source = h.source;
  sat::fuzz::require(sat::hardware_json(h2) == json, "hardware_json round-trips");
  return 0;
}
