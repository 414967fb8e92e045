// Model files (--model file:NET.json) through model_config (src/nn/model_file.cpp, with the
// JSON reader of src/core/json.cpp). An accepted file must describe itself, build its graph
// at another batch size, and answer the tensor-parallel and recompute checks with a
// sat::Error or nothing.
#include <string>

#include "fuzz_util.h"
#include "nn/models.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("net.json");
  sat::fuzz::write_file(path, data, size);
  sat::ModelConfig c;
  if (!sat::fuzz::accepts([&] { c = sat::model_config("file:" + path); })) return 0;
  (void)sat::describe_model(c);
  sat::fuzz::require(sat::model_spec(c) == "file:" + path, "a file's spec is its path");
  sat::fuzz::require(sat::fuzz::accepts([&] { sat::build_model(c, 3); }), "an accepted file builds at any batch");
  sat::fuzz::accepts([&] { sat::check_tensor_parallel(c, 2, false); });
  sat::fuzz::accepts([&] { sat::check_tensor_parallel(c, 2, true); });
  c.recompute = sat::Recompute::full;
  sat::fuzz::accepts([&] { sat::check_recompute(c); });
  return 0;
}
