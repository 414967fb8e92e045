// saturate.plan and saturate.info: the library's plan_json / info_json (saturate plan --json,
// saturate info) parsed into Records.
#include "bind.h"

namespace saturate::py_bind {

namespace {

std::string text_or_empty(py::handle v) { return v.is_none() ? "" : py::str(v).cast<std::string>(); }

py::object plan(py::handle model_h, int64_t global_batch, int gpus, const std::string& gpu, int gpus_per_node,
                py::handle precision, const std::string& optimizer, py::handle layout, py::handle memory_budget, int top,
                bool runnable_only, const std::string& engine) {
  const Model model = model_arg(model_h);
  PlanOptions o;
  o.global_batch = global_batch, o.gpus = gpus, o.gpu = gpu, o.gpus_per_node = gpus_per_node;
  o.precision = text_or_empty(precision), o.optimizer = optimizer, o.layout = text_or_empty(layout);
  o.memory_budget = text_or_empty(memory_budget), o.top = top, o.runnable_only = runnable_only, o.engine = engine;
  std::string json;
  {
    py::gil_scoped_release nogil;
    json = plan_json(model, o);
  }
  return parse_json(json);
}

py::object info(py::handle model_h, int64_t batch, int64_t accum, int ranks, int tp, int pp, int zero,
                const std::string& recompute, const std::string& precision, const std::string& optimizer,
                const std::string& device) {
  const Model model = model_arg(model_h);
  InfoOptions o;
  o.batch = batch, o.accum = accum, o.ranks = ranks, o.tp = tp, o.pp = pp, o.zero = zero, o.recompute = recompute;
  o.precision = precision, o.optimizer = optimizer, o.device = device;
  std::string json;
  {
    py::gil_scoped_release nogil;
    json = info_json(model, o);
  }
  return parse_json(json);
}

}  // namespace

void bind_plan(py::module_& m) {
  m.def("plan", &plan, py::arg("model"), py::kw_only(), py::arg("global_batch"), py::arg("gpus") = 8,
        py::arg("gpu") = "a100-80gb", py::arg("gpus_per_node") = 0, py::arg("precision") = py::none(),
        py::arg("optimizer") = "adamw", py::arg("layout") = py::none(), py::arg("memory_budget") = py::none(),
        py::arg("top") = 5, py::arg("runnable_only") = false, py::arg("engine") = "saturate",
        "saturate plan: the best layouts of model over gpus devices of kind gpu (a Record of saturate plan --json)");
  m.def("info", &info, py::arg("model"), py::kw_only(), py::arg("batch") = 64, py::arg("accum") = 1,
        py::arg("ranks") = 1, py::arg("tp") = 1, py::arg("pp") = 1, py::arg("zero") = 0, py::arg("recompute") = "none",
        py::arg("precision") = "fp32", py::arg("optimizer") = "adamw", py::arg("device") = "cpu",
        "saturate info: the model's size, work and memory plan for a layout (a Record)");
}

}  // namespace saturate::py_bind
