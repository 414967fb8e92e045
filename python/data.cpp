// NumPy arrays into the library's datasets (bind.h dataset_of): dtypes and shapes checked
// here, naming the argument, before saturate sees them.
#include "bind.h"

namespace saturate::py_bind {

namespace {

std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }
std::string shape_str(const py::array& a) {
  return py::str(py::tuple(py::cast(std::vector<int64_t>(a.shape(), a.shape() + a.ndim())))).cast<std::string>();
}

py::array as_array(py::handle v, const std::string& name) {
  if (v.is_none()) bad_argument(name, "expected a NumPy array, got None");
  return py::array::ensure(v);  // lists, torch tensors (__array__), ...
}

char kind_of(const py::array& a) { return a.dtype().kind(); }

// An integer array as int32, every value within [lo, hi).
std::vector<int32_t> ints(const py::array& a, const std::string& name, int64_t lo, int64_t hi, const char* what) {
  if (kind_of(a) != 'i' && kind_of(a) != 'u')
    bad_argument(name, std::string("expected an integer array of ") + what + "s, got " + dtype_name(a));
  auto v = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  std::vector<int32_t> out(size_t(v.size()));
  for (py::ssize_t i = 0; i < v.size(); ++i) {
    const int64_t x = v.data()[i];
    if (x < lo || x >= hi)
      bad_argument(name, std::string(what) + " " + std::to_string(i) + " (flat index) is " + std::to_string(x) +
                             ", outside " + std::to_string(lo) + " to " + std::to_string(hi - 1));
    out[size_t(i)] = int32_t(x);
  }
  return out;
}

// The per-sample shape of x [N, ...] as saturate takes it: the model's when the values
// agree in number, else padded to [C, H, W] (a feature vector [F] is [1, 1, F]).
std::vector<int64_t> sample_shape(const Model& model, const py::array& x, const std::string& name) {
  std::vector<int64_t> s(x.shape() + 1, x.shape() + x.ndim());
  if (s.size() > 3) bad_argument(name, "expected samples [N, C, H, W] or fewer dimensions, got shape " + shape_str(x));
  int64_t n = 1, want = 1;
  for (int64_t d : s) n *= d;
  for (int64_t d : model.input_shape()) want *= d;
  if (n == want) return model.input_shape();
  s.insert(s.begin(), 3 - s.size(), 1);
  return s;
}

Dataset tokens_of(const Model& model, const py::array& x, py::handle yh, const std::string& xname,
                  const std::string& yname) {
  if (x.ndim() != 2) bad_argument(xname, "expected token windows [N, T], got shape " + shape_str(x));
  const int64_t vocab = model.classes(), T = x.shape(1);
  std::vector<int32_t> tokens = ints(x, xname, 0, vocab, "token"), next;
  if (!yh.is_none()) {
    const py::array y = as_array(yh, yname);
    if (y.ndim() != 2 || y.shape(0) != x.shape(0) || y.shape(1) != T)
      bad_argument(yname, "expected the next tokens [N, T] of " + xname + " " + shape_str(x) + ", got shape " +
                              shape_str(y));
    next = ints(y, yname, -1, vocab, "next token");
  }
  return Dataset::from_tokens(std::move(tokens), T, std::move(next), vocab, xname);
}

}  // namespace

Dataset dataset_of(const Model& model, py::handle xh, py::handle yh, const std::string& xname,
                   const std::string& yname) {
  const py::array x = as_array(xh, xname);
  if (x.ndim() < 2 || x.shape(0) < 1)
    bad_argument(xname, "expected samples [N, ...] with N >= 1, got shape " + shape_str(x));
  if (model.takes_tokens()) return tokens_of(model, x, yh, xname, yname);
  if (kind_of(x) != 'f') bad_argument(xname, "expected a float32 array of samples, got " + dtype_name(x));
  auto xf = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(x);
  std::vector<int32_t> labels;
  if (!yh.is_none()) {
    const py::array y = as_array(yh, yname);
    if (y.ndim() != 1 || y.shape(0) != x.shape(0))
      bad_argument(yname, "expected " + std::to_string(x.shape(0)) + " class labels [N] for " + xname + " " +
                              shape_str(x) + ", got shape " + shape_str(y));
    labels = ints(y, yname, 0, model.classes(), "label");
  }
  std::vector<float> values(xf.data(), xf.data() + xf.size());
  return Dataset::from_arrays(std::move(values), sample_shape(model, x, xname), std::move(labels), model.classes(),
                              xname);
}

}  // namespace saturate::py_bind
