// saturate.fit, evaluate and predict on NumPy arrays: the library's (saturate train's
// trainer) with the GIL released while saturate runs, taken back for the callbacks; Ctrl-C
// stops fit after the step it is in.
#include <pybind11/functional.h>

#include <signal.h>

#include <atomic>
#include <exception>

#include "bind.h"

namespace saturate::py_bind {

namespace {

int64_t batch_of(py::handle b) {
  if (py::isinstance<py::str>(b) && b.cast<std::string>() == "auto") return 0;  // the tuner
  if (py::isinstance<py::int_>(b) && !py::isinstance<py::bool_>(b) && b.cast<int64_t>() >= 1) return b.cast<int64_t>();
  bad_argument("batch_size", "expected a positive int or 'auto', got " + std::string(py::repr(b)));
}

py::object epoch_record(const EpochLog& e) {
  py::dict d;
  d["epoch"] = e.epoch, d["loss"] = number_or_none(e.loss), d["val_loss"] = number_or_none(e.val_loss);
  d["val_accuracy"] = number_or_none(e.val_accuracy), d["seconds"] = e.seconds;
  return record(d);
}

py::object history_record(const History& h) {
  py::list epochs;
  for (const EpochLog& e : h.epochs) epochs.append(epoch_record(e));
  py::dict d;
  d["loss"] = py::cast(h.loss), d["epochs"] = epochs, d["batch_size"] = h.batch_size;
  d["accumulation"] = h.accumulation, d["processes"] = h.processes, d["steps"] = h.steps;
  d["samples_per_second"] = h.samples_per_second, d["seconds"] = h.seconds;
  d["predicted_memory_bytes"] = h.predicted_memory_bytes, d["peak_memory_bytes"] = h.peak_memory_bytes;
  return record(d);
}

// The Python callbacks, run with the GIL; the first exception one raises stops training
// (after that epoch) and is raised again once fit returns.
struct Callbacks {
  py::object on_epoch, on_step;
  std::exception_ptr failed;

  void hook(FitOptions& o) {
    if (!on_epoch.is_none()) o.on_epoch = [this](const EpochLog& e) { return call_epoch(e); };
    if (!on_step.is_none()) o.on_step = [this](const StepLog& s) { call_step(s); };
  }
  bool call_epoch(const EpochLog& e) {
    py::gil_scoped_acquire gil;
    if (failed) return false;
    try {
      py::object r = on_epoch(epoch_record(e));
      return !(py::isinstance<py::bool_>(r) && !r.cast<bool>());  // False stops, anything else goes on
    } catch (...) {
      failed = std::current_exception();
      return false;
    }
  }
  void call_step(const StepLog& s) {
    py::gil_scoped_acquire gil;
    if (failed) return;
    try {
      py::dict d;
      d["step"] = s.step, d["epoch"] = s.epoch, d["loss"] = s.loss, d["lr"] = s.lr;
      d["seconds"] = s.seconds, d["samples_per_second"] = s.samples_per_second;
      on_step(record(d));
    } catch (...) {
      failed = std::current_exception();
    }
  }
};

// Ctrl-C while saturate trains without the GIL: on Python's main thread, with Python's own
// handler in place (KeyboardInterrupt), SIGINT sets a flag that stops training after the
// step (FitOptions::stop_requested), and fit then raises KeyboardInterrupt.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

class CtrlC {
 public:
  explicit CtrlC(FitOptions& o) {
    py::module_ signal = py::module_::import("signal"), threading = py::module_::import("threading");
    if (!threading.attr("current_thread")().is(threading.attr("main_thread")()) ||
        !signal.attr("getsignal")(signal.attr("SIGINT")).is(signal.attr("default_int_handler")))
      return;
    g_interrupted = false;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    active_ = sigaction(SIGINT, &sa, &old_) == 0;
    if (active_) o.stop_requested = [] { return g_interrupted.load(); };
  }
  ~CtrlC() {
    if (active_) sigaction(SIGINT, &old_, nullptr);
  }
  // After fit: KeyboardInterrupt when Ctrl-C stopped it.
  void raise_if_interrupted() const {
    if (!active_ || !g_interrupted) return;
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }

 private:
  bool active_ = false;
  struct sigaction old_ {};
};

py::object fit(py::handle model_h, py::handle x, py::handle y, py::handle batch_size, int64_t epochs, int64_t steps,
               py::handle validation, bool shuffle, double lr, const std::string& optimizer, py::handle weight_decay,
               double momentum, bool nesterov, py::handle betas, double eps, double clip_grad_norm,
               const std::string& schedule, double warmup, uint64_t seed, int threads,
               const std::string& precision, bool progress, py::object on_epoch, py::object on_step,
               py::handle out_dir) {
  if (!py::isinstance<Model>(model_h)) bad_argument("model", "expected a saturate.Model");
  Model& model = model_h.cast<Model&>();
  FitOptions o;
  o.batch_size = batch_of(batch_size);
  o.epochs = epochs, o.steps = steps, o.shuffle = shuffle, o.seed = seed, o.threads = threads;
  o.precision = precision, o.progress = progress;
  o.optimizer.name = optimizer, o.optimizer.lr = lr, o.optimizer.momentum = momentum;
  o.optimizer.nesterov = nesterov, o.optimizer.eps = eps, o.optimizer.clip_grad_norm = clip_grad_norm;
  auto number = [](py::handle v) { return py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v); };
  if (!py::isinstance<py::sequence>(betas) || py::isinstance<py::str>(betas) || py::len(betas) != 2 ||
      !number(betas[py::int_(0)]) || !number(betas[py::int_(1)]))
    bad_argument("betas", "expected a pair of numbers (beta1, beta2), got " + std::string(py::repr(betas)));
  o.optimizer.beta1 = betas[py::int_(0)].cast<double>(), o.optimizer.beta2 = betas[py::int_(1)].cast<double>();
  o.optimizer.schedule = schedule, o.optimizer.warmup_fraction = warmup;
  if (!weight_decay.is_none()) o.optimizer.weight_decay = weight_decay.cast<double>();
  if (!out_dir.is_none()) o.out_dir = py::str(py::module_::import("os").attr("fspath")(out_dir));
  const Dataset train = dataset_of(model, x, y, "x", "y");
  if (!validation.is_none()) {
    if (!py::isinstance<py::tuple>(validation) || py::len(validation) != 2)
      bad_argument("validation", "expected a tuple (x, y), got " +
                                   std::string(py::str(py::type::of(validation).attr("__name__"))));
    const py::tuple v = validation.cast<py::tuple>();
    o.validation = dataset_of(model, v[0], v[1], "validation x", "validation y");
  }
  Callbacks cb{on_epoch, on_step, nullptr};
  cb.hook(o);
  CtrlC ctrl_c(o);
  History h;
  {
    py::gil_scoped_release nogil;
    h = saturate::fit(model, train, o);
  }
  if (cb.failed) std::rethrow_exception(cb.failed);
  ctrl_c.raise_if_interrupted();
  return history_record(h);
}

py::object evaluate(py::handle model_h, py::handle x, py::handle y, int64_t batch_size) {
  const Model model = model_arg(model_h);
  if (y.is_none()) bad_argument("y", "evaluate needs the labels");
  const Dataset d = dataset_of(model, x, y, "x", "y");
  Evaluation e;
  {
    py::gil_scoped_release nogil;
    e = saturate::evaluate(model, d, batch_size);
  }
  py::dict r;
  r["loss"] = e.loss, r["accuracy"] = number_or_none(e.accuracy), r["samples"] = e.samples;
  return record(r);
}

// Logits [N, classes] ([N, T, vocab] for token models), or their softmax.
py::array predict(py::handle model_h, py::handle x, int64_t batch_size, bool probabilities) {
  const Model model = model_arg(model_h);
  const Dataset d = dataset_of(model, x, py::none(), "x", "y");
  Predictions p;
  std::vector<float> values;
  {
    py::gil_scoped_release nogil;
    p = saturate::predict(model, d, batch_size);
    values = probabilities ? p.probabilities() : std::move(p.logits);
  }
  std::vector<int64_t> shape{p.rows, p.width};
  if (model.takes_tokens()) shape = {d.size(), p.rows / d.size(), p.width};
  py::array_t<float> out(shape);
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

}  // namespace

void bind_fit(py::module_& m) {
  m.def("fit", &fit, py::arg("model"), py::arg("x"), py::arg("y"), py::kw_only(), py::arg("batch_size") = 64,
        py::arg("epochs") = 1, py::arg("steps") = 0, py::arg("validation") = py::none(), py::arg("shuffle") = true,
        py::arg("lr") = 1e-3, py::arg("optimizer") = "adamw", py::arg("weight_decay") = py::none(),
        py::arg("momentum") = 0.0, py::arg("nesterov") = false, py::arg("betas") = py::make_tuple(0.9, 0.999),
        py::arg("eps") = 1e-8, py::arg("clip_grad_norm") = 0.0, py::arg("schedule") = "cosine", py::arg("warmup") = 0.05, py::arg("seed") = 0,
        py::arg("threads") = 0, py::arg("precision") = "fp32", py::arg("progress") = true,
        py::arg("on_epoch") = py::none(), py::arg("on_step") = py::none(), py::arg("out_dir") = py::none(),
        "Trains model on x, y (saturate train's trainer; data-parallel under mpirun); returns the history");
  m.def("evaluate", &evaluate, py::arg("model"), py::arg("x"), py::arg("y"), py::kw_only(), py::arg("batch_size") = 64,
        "The mean loss (and accuracy) over every sample: a Record(loss, accuracy, samples)");
  m.def("predict", &predict, py::arg("model"), py::arg("x"), py::kw_only(), py::arg("batch_size") = 64,
        py::arg("probabilities") = false, "The model's logits (or softmax probabilities) for every sample");
}

}  // namespace saturate::py_bind
