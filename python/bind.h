// The Python module `saturate` (python/module.cpp): the pieces each source file binds, and
// what they share: Records (the module's dicts whose keys read as attributes), argument
// errors as saturate.Error, and NumPy arrays into the library's datasets.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "saturate/saturate.h"

namespace saturate::py_bind {

namespace py = pybind11;

void bind_model(py::module_& m);
void bind_fit(py::module_& m);
void bind_plan(py::module_& m);

// A saturate.Error (Python) for a bad argument: "ARG: what".
[[noreturn]] void bad_argument(const std::string& arg, const std::string& what);

// saturate.Record(**fields): a dict whose keys read as attributes too.
py::object record(const py::dict& fields);
// JSON text as Python objects, its objects as Records.
py::object parse_json(const std::string& text);
// A float that is NaN as None (a value the run did not measure).
py::object number_or_none(double v);

// The model passed as `arg`: a saturate.Model, or a spec string for Model.load.
Model model_arg(py::handle model);

// NumPy samples `x` (and labels `y`, unless y is None) as a dataset for `model`:
// float arrays [N, ...] for image and feature models (the per-sample shape the model's, or
// padded to [C, H, W]), integer tokens [N, T] for token models with next tokens y [N, T]
// (-1: ignored); class labels y [N] otherwise. Errors name xname and yname.
Dataset dataset_of(const Model& model, py::handle x, py::handle y, const std::string& xname,
                   const std::string& yname);

}  // namespace saturate::py_bind
