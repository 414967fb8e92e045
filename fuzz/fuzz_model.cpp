// --model strings through model_config (src/nn/model_config.cpp). An accepted string must
// describe itself (model_spec, describe_model) and its spec must parse back to the same spec.
#include <string>

#include "fuzz_util.h"
#include "nn/models.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string s(reinterpret_cast<const char*>(data), size);
  sat::ModelConfig c;
  if (!sat::fuzz::accepts([&] { c = sat::model_config(s); })) return 0;
  const std::string spec = sat::model_spec(c);
  (void)sat::describe_model(c);
  sat::ModelConfig again;
  sat::fuzz::require(sat::fuzz::accepts([&] { again = sat::model_config(spec); }), "model_spec parses back");
  sat::fuzz::require(sat::model_spec(again) == spec, "model_spec round-trips");
  sat::fuzz::accepts([&] { sat::check_tensor_parallel(c, 2, true); });
  sat::fuzz::accepts([&] { sat::check_recompute(c); });
  return 0;
}
