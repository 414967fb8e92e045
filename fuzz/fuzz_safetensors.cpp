// safetensors files through load_safetensors (src/nn/safetensors.cpp) into the parameter
// stores of two small models: byte 0 chooses the store (even: convnet, whose BatchNorm
// states include an int64 counter; odd: a 1-layer GPT's tensor-parallel part, rank 0 of 2,
// whose split tensors are read from the file's full tensor); the rest is the file.
#include <memory>
#include <set>

#include "fuzz_util.h"
#include "nn/models.h"
#include "nn/params.h"
#include "nn/safetensors.h"

namespace {

struct Store {
  std::unique_ptr<sat::ParamStore> ps;
  std::set<std::string> names;
};

Store make_store(const std::string& model, int tp) {
  sat::ModelConfig c = sat::model_config(model);
  c.tp = tp;
  sat::BuiltModel m = sat::build_model(c, 2);
  Store s;
  s.ps = std::make_unique<sat::ParamStore>(m.graph->params(), m.graph->states(), 0);
  s.ps->init(1);
  for (const auto& d : m.graph->params()) s.names.insert(d.name);
  for (const auto& d : m.graph->states()) s.names.insert(d.name);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static Store stores[2] = {make_store("convnet", 1), make_store("gpt:layers=1,heads=2,width=8,context=4,vocab=16", 2)};
  Store& s = stores[data[0] & 1];
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("w.safetensors");
  sat::fuzz::write_file(path, data + 1, size - 1);
  sat::fuzz::accepts([&] { sat::load_safetensors(path, *s.ps, &s.names); });
  return 0;
}
