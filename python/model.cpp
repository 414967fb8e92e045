// saturate.Model: a model of saturate's layers (Model.load takes what --model takes, from_json
// a model file's text, from_torch a torch.nn.Module through saturate_torch), its weights as
// NumPy float32 arrays by name.

#include "bind.h"

namespace saturate::py_bind {

namespace {

std::string path_of(py::handle path) { return py::str(py::module_::import("os").attr("fspath")(path)); }

py::dict weights_of(const Model& m) {
  py::dict out;
  for (const std::string& name : m.weight_names()) {
    const std::vector<float> v = m.weight(name);
    py::array_t<float> a(m.weight_shape(name));
    std::copy(v.begin(), v.end(), a.mutable_data());
    out[py::str(name)] = a;
  }
  return out;
}

// One value of set_weights' dict: an array of the weight's shape (any real dtype).
std::vector<float> values_of(const Model& m, const std::string& name, py::handle value) {
  using F = py::array_t<float, py::array::c_style | py::array::forcecast>;
  F a;
  try {
    a = F::ensure(value);
  } catch (const py::error_already_set&) {
  }
  if (!a) bad_argument("set_weights", "'" + name + "': expected an array of numbers, got " +
                                          std::string(py::str(py::type::of(value).attr("__name__"))));
  const std::vector<int64_t> want = m.weight_shape(name);  // Error naming an unknown weight
  const std::vector<int64_t> got(a.shape(), a.shape() + a.ndim());
  int64_t n = 1;
  for (int64_t d : want) n *= d;
  if (got != want && !(n == 1 && a.size() == 1))
    bad_argument("set_weights", "'" + name + "' has shape " + std::string(py::str(py::tuple(py::cast(want)))) +
                                    ", got " + std::string(py::str(py::tuple(py::cast(got)))));
  return std::vector<float>(a.data(), a.data() + a.size());
}

void set_weights(Model& m, const py::dict& weights) {
  std::map<std::string, std::vector<float>> values;
  for (auto [key, value] : weights) {
    if (!py::isinstance<py::str>(key)) bad_argument("set_weights", "expected weight names (str) as keys");
    const std::string name = key.cast<std::string>();
    values[name] = values_of(m, name, value);
  }
  m.set_weights(values);
}

// saturate.from_torch(module, example_input): saturate_torch's import as a Model that keeps
// the import (its state_dict maps the weights back to the module's).
py::object from_torch(py::handle module, py::handle example, py::object name) {
  py::module_ importer;
  try {
    importer = py::module_::import("saturate_torch");
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    throw py::import_error("saturate.from_torch needs saturate_torch (saturate_torch.py, installed beside the "
                           "saturate module): " + std::string(py::str(e.value())));
  }
  py::object imp;
  try {
    imp = importer.attr("import_module")(module, example, py::arg("name") = name);
  } catch (py::error_already_set& e) {  // the importer's refusal, as every other mistake: a saturate.Error
    if (!e.matches(importer.attr("TorchImportError"))) throw;
    throw Error(py::str(e.value()).cast<std::string>());
  }
  const std::string model_name = name.is_none() ? py::str(py::type::of(module).attr("__name__")).cast<std::string>()
                                                : name.cast<std::string>();
  Model m = Model::from_json(imp.attr("model_json").cast<std::string>(), model_name);
  set_weights(m, imp.attr("weights"));
  py::object out = py::cast(m);
  out.attr("_torch_import") = imp;
  return out;
}

py::object torch_state_dict(py::object self) {
  py::object imp = py::getattr(self, "_torch_import", py::none());
  if (imp.is_none())
    throw Error("model '" + self.cast<const Model&>().name() + "' was not imported from PyTorch (saturate.from_torch)");
  return imp.attr("state_dict")(weights_of(self.cast<const Model&>()));
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Model>(m, "Model", py::dynamic_attr(), "A network of saturate's layers and, once fitted or loaded, its weights.")
      .def_static("load", &Model::load, py::arg("spec"),
                  "A built-in or family as --model takes it ('mlp', 'resnet:34', 'gpt:layers=2,...'), or a model file")
      .def_static("from_json", &Model::from_json, py::arg("text"), py::arg("name") = "model",
                  "A model from a model file's text")
      .def_property_readonly("name", &Model::name)
      .def("summary", &Model::summary)
      .def_property_readonly("parameters", &Model::parameters)
      .def_property_readonly("input_shape", [](const Model& x) { return py::tuple(py::cast(x.input_shape())); })
      .def_property_readonly("classes", &Model::classes)
      .def_property_readonly("takes_tokens", &Model::takes_tokens)
      .def_property_readonly("has_weights", &Model::has_weights)
      .def_property_readonly("json", [](const Model& x) -> py::object {
        const std::string j = x.json();
        if (j.empty()) return py::none();
        return py::str(j);
      })
      .def("weights", &weights_of, "name -> float32 array (empty until fitted or loaded)")
      .def("set_weights", &set_weights, py::arg("weights"), "from a dict name -> array, shapes checked")
      .def("save", [](const Model& x, py::handle p) { x.save(path_of(p)); }, py::arg("path"), "safetensors")
      .def("load_weights", [](Model& x, py::handle p) { x.load_weights(path_of(p)); }, py::arg("path"))
      .def("state_dict_for_torch", &torch_state_dict,
           "the weights as the imported torch module's state_dict (models from from_torch)")
      .def("__repr__", [](const Model& x) { return "<saturate.Model " + x.summary() + ">"; });
  m.def("from_torch", &from_torch, py::arg("module"), py::arg("example_input"), py::arg("name") = py::none(),
        "a torch.nn.Module as a saturate Model with its weights (saturate_torch.import_module)");
}

}  // namespace saturate::py_bind
