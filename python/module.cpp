// The Python module `saturate` (issue 39): the C++ library (include/saturate) in Python.
// Models (Model.load, from_torch), weights as NumPy arrays, plan and info as Records, and
// fit / evaluate / predict on NumPy arrays with the GIL released while saturate trains.
// saturate::Error is saturate.Error, a ValueError carrying saturate's one-line message.
#include <dlfcn.h>
#include <pybind11/eval.h>

#include <cmath>

#include "bind.h"

namespace saturate::py_bind {

void bad_argument(const std::string& arg, const std::string& what) { throw Error(arg + ": " + what); }

py::object record(const py::dict& fields) { return py::module_::import("saturate").attr("Record")(fields); }

py::object parse_json(const std::string& text) {
  return py::module_::import("json").attr("loads")(text, py::arg("object_hook") = py::module_::import("saturate").attr("Record"));
}

py::object number_or_none(double v) { return std::isnan(v) ? py::none() : py::object(py::float_(v)); }

Model model_arg(py::handle model) {
  if (py::isinstance<py::str>(model)) return Model::load(model.cast<std::string>());
  if (!py::isinstance<Model>(model))
    bad_argument("model", "expected a saturate.Model or a model spec string, got " +
                              std::string(py::str(py::type::of(model).attr("__name__"))));
  return model.cast<Model>();
}

namespace {

// Records: what plan, info, fit and evaluate return.
const char* kRecord = R"(
class Record(dict):
    """A dict whose keys read as attributes too (plan.best.dp is plan["best"]["dp"])."""
    __slots__ = ()

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __dir__(self):
        return list(self.keys()) + dir(dict)
)";

// OpenMPI loads its components as plugins that expect libmpi's symbols to be global; Python
// loads this module (and so libmpi) with RTLD_LOCAL. Promote it, as mpi4py does.
void promote_mpi() {
#if SAT_HAVE_MPI
  for (const char* lib : {"libmpi.so.40", "libmpi.so.12", "libmpi.so"})
    if (dlopen(lib, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) break;
#endif
}

}  // namespace

}  // namespace saturate::py_bind

PYBIND11_MODULE(saturate, m) {
  namespace sb = saturate::py_bind;
  m.doc() = "saturate: train, plan and inspect neural networks with saturate's C++ engine";
  m.attr("__version__") = SAT_VERSION;
  sb::promote_mpi();
  pybind11::register_exception<saturate::Error>(m, "Error", PyExc_ValueError);
  pybind11::exec(sb::kRecord, m.attr("__dict__"));
  m.attr("Record").attr("__module__") = "saturate";
  sb::bind_model(m);
  sb::bind_fit(m);
  sb::bind_plan(m);
}
