// fit, evaluate and predict (include/saturate/fit.h): saturate's Trainer, the one `saturate
// train` runs, over the library's handles. An epoch ends inside Trainer::run at the
// stop_early question, which every rank asks after the epoch's last step (and after on_step
// has seen it): validation runs there, through the trainer's own evaluation, and the
// user's on_epoch decides whether to go on. Weights move between the Model and the
// trainer's parameters by name.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "api/impl.h"
#include "saturate/fit.h"
#include "backend/cpu/blas.h"
#include "core/timer.h"
#include "dist/comm.h"
#include "train/trainer.h"
#include "train/plan.h"
#include "train/validate.h"
#include "tune/policy.h"

namespace saturate {

namespace {

void check_options(const FitOptions& o) {
  SAT_CHECK(o.batch_size >= 0, "FitOptions::batch_size: expected a micro-batch of 1 or more, or 0 (the tuner "
            "chooses), got ", o.batch_size);
  SAT_CHECK(o.steps >= 0, "FitOptions::steps: expected 0 (train for epochs) or more, got ", o.steps);
  SAT_CHECK(o.steps > 0 || o.epochs >= 1, "FitOptions::epochs: expected 1 or more, got ", o.epochs);
  SAT_CHECK(o.threads >= 0, "FitOptions::threads: expected 0 (every core) or more, got ", o.threads);
  SAT_CHECK(o.precision == "fp32" || o.precision == "bf16", "FitOptions::precision: expected fp32 or bf16, got '",
            o.precision, "'");
  SAT_CHECK(o.optimizer.name == "adamw" || o.optimizer.name == "sgd",
            "FitOptions::optimizer.name: expected adamw or sgd, got '", o.optimizer.name, "'");
  SAT_CHECK(o.optimizer.schedule == "cosine" || o.optimizer.schedule == "constant",
            "FitOptions::optimizer.schedule: expected cosine or constant, got '", o.optimizer.schedule, "'");
  SAT_CHECK(o.optimizer.lr > 0 && std::isfinite(o.optimizer.lr), "FitOptions::optimizer.lr: expected a rate > 0, got ",
            o.optimizer.lr);
  const OptimizerOptions& p = o.optimizer;
  SAT_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1, "FitOptions::optimizer.beta1/beta2: expected "
            "decay rates in [0, 1), got ", p.beta1, ", ", p.beta2);
  SAT_CHECK(p.eps > 0 && std::isfinite(p.eps), "FitOptions::optimizer.eps: expected a term > 0, got ", p.eps);
  SAT_CHECK(p.clip_grad_norm >= 0 && std::isfinite(p.clip_grad_norm), "FitOptions::optimizer.clip_grad_norm: expected "
            "a norm > 0, or 0 for no clipping, got ", p.clip_grad_norm);
  SAT_CHECK(!p.nesterov || (p.name == "sgd" && p.momentum > 0), "FitOptions::optimizer.nesterov: needs sgd with a "
            "momentum > 0");
  SAT_CHECK(o.optimizer.warmup_fraction >= 0 && o.optimizer.warmup_fraction < 1,
            "FitOptions::optimizer.warmup_fraction: expected a share of the steps in [0, 1), got ",
            o.optimizer.warmup_fraction);
}

// The data against the model: a message naming both, before any trainer is built.
void check_data(const sat::ModelConfig& mc, const Dataset& d, const char* what) {
  const sat::Dataset& ds = *d.impl()->data;
  SAT_CHECK(ds.is_tokens() == mc.tokens, what, " '", ds.name(), "' holds ", ds.is_tokens() ? "tokens" : "images",
            " but model '", mc.name, "' takes ", mc.tokens ? "tokens" : "images");
  if (mc.tokens) {
    SAT_CHECK(ds.sample_shape()[0] == mc.seq_len, what, " '", ds.name(), "' has windows of ", ds.sample_shape()[0],
              " tokens but model '", mc.name, "' takes ", mc.seq_len);
  } else if (mc.family == sat::ModelFamily::file) {  // the file fixes its input; the built-ins take the data's
    SAT_CHECK(ds.sample_shape() == mc.image, what, " '", ds.name(), "' has samples of shape ", ds.sample_shape().str(),
              " but model '", mc.name, "' takes ", mc.image.str());
  } else if (mc.family == sat::ModelFamily::mlp) {
    SAT_CHECK(ds.sample_shape().numel() == mc.mlp_widths.front(), what, " '", ds.name(), "' has samples of shape ",
              ds.sample_shape().str(), " but model '", mc.name, "' takes ", mc.mlp_widths.front(), " values");
  }
  SAT_CHECK(ds.num_classes() <= mc.classes, what, " '", ds.name(), "' has ", ds.num_classes(), " classes but model '",
            mc.name, "' gives ", mc.classes, " logits");
}

sat::TrainConfig train_config(const FitOptions& o, bool validate) {
  sat::TrainConfig c;
  c.batch = std::max<int64_t>(o.batch_size, 1);
  c.epochs = o.epochs;
  c.steps = o.steps;
  c.optim.name = o.optimizer.name;
  c.optim.lr = float(o.optimizer.lr);
  c.optim.weight_decay = float(o.optimizer.weight_decay);
  c.optim.momentum = float(o.optimizer.momentum);
  c.optim.nesterov = o.optimizer.nesterov;
  c.optim.beta1 = float(o.optimizer.beta1);
  c.optim.beta2 = float(o.optimizer.beta2);
  c.optim.eps = float(o.optimizer.eps);
  c.optim.clip_grad_norm = float(o.optimizer.clip_grad_norm);
  c.schedule.name = o.optimizer.schedule;
  c.schedule.warmup_fraction = o.optimizer.warmup_fraction;
  c.seed = o.seed;
  c.precision = sat::parse_precision(o.precision);
  c.shuffle = o.shuffle;
  c.evaluate = validate;
  c.out_dir = o.out_dir;
  c.progress = o.progress ? -1 : 0;
  return c;
}

// batch_size 0: the tuner's micro-batch, accumulation and scaled rate, by the policy of
// saturate train --batch auto (tune/policy.h) without its cache, its cost model or its lines.
void tune_batch(const sat::ModelConfig& mc, const sat::Dataset& train, bool progress, sat::dist::Comm& comm,
                sat::TrainConfig& c) {
  sat::TunePolicy p;
  p.tune.progress = progress ? 1 : 0;
  p.tune.noise_steps = 0;  // the throughput objective does not use it
  p.cache = p.cost_model = p.print = false;
  sat::apply_tuning(p, mc, train, nullptr, comm, c);
}

// The job's plan, as saturate train builds it: validated, for this process's ranks.
std::unique_ptr<sat::JobPlan> plan_job(const sat::ModelConfig& mc, const sat::TrainConfig& c, const sat::Dataset& train,
                                       const sat::Dataset* val, int world) {
  sat::validate_run(mc, c, world);
  return std::make_unique<sat::JobPlan>(sat::resolved_model(mc, c), c, train, val, c.dp_of(world));
}

// The model's weights into a trainer's parameters (on the host: the trainer runs on the CPU).
void load_into(const Model& model, sat::Trainer& t) {
  if (model.impl()->weights) copy_weights(*model.impl()->weights, t.params());
}

// What a fit records of each epoch, and when its last step has run.
struct Epochs {
  int64_t per_epoch = 1;
  std::vector<double> losses;  // of the current epoch's steps
  double started = 0;

  EpochLog close(int64_t epoch, double now) {
    EpochLog e;
    e.epoch = epoch;
    e.loss = losses.empty() ? NAN : std::accumulate(losses.begin(), losses.end(), 0.0) / double(losses.size());
    e.seconds = now - started;
    losses.clear();
    started = now;
    return e;
  }
};

void add_validation(EpochLog& e, const sat::EvalResult& v) {
  e.val_loss = v.loss;
  e.val_accuracy = v.accuracy >= 0 ? v.accuracy : NAN;
}

History history_of(const sat::TrainResult& r, const sat::TrainConfig& c, std::vector<EpochLog> epochs) {
  History h;
  h.loss = r.losses;
  h.epochs = std::move(epochs);
  h.batch_size = c.batch;
  h.accumulation = c.accum;
  h.processes = r.world_size;
  h.steps = r.steps;
  h.samples_per_second = r.samples_per_second;
  h.seconds = r.wall_seconds;
  h.predicted_memory_bytes = r.predicted_memory_bytes;
  h.peak_memory_bytes = r.peak_memory_bytes;
  return h;
}

History run_fit(Model& model, const Dataset& train, const FitOptions& o) {
  check_options(o);
  sat::cpu::set_num_threads(o.threads);
  SAT_CHECK(train.labelled(), "fit: dataset '", train.name(), "' has no labels");
  sat::ModelConfig mc = model.impl()->config;
  check_data(mc, train, "fit: dataset");
  if (o.validation) {
    SAT_CHECK(o.validation->labelled(), "FitOptions::validation: dataset '", o.validation->name(), "' has no labels");
    check_data(mc, *o.validation, "FitOptions::validation: dataset");
  }
  const sat::Dataset& ds = *train.impl()->data;
  sat::fit_to_data(mc, ds);
  const sat::Dataset* val = o.validation ? o.validation->impl()->data.get() : nullptr;
  sat::TrainConfig c = train_config(o, val != nullptr);
  // Validated and planned before MPI starts, as saturate train; a rank that fails here
  // takes its part in the job's first verdict (make_world_comm's) so the others stop too.
  const int world = sat::dist::detect_process().world;
  std::unique_ptr<sat::JobPlan> job;
  try {
    if (o.batch_size > 0) job = plan_job(mc, c, ds, val, world);
    else sat::validate_run(mc, c, world);  // the tuner chooses the batch the job is planned for
  } catch (const sat::Error& e) {
    sat::dist::report_failure_to_job(e.what());
    throw;
  }
  std::unique_ptr<sat::dist::Comm> comm = sat::dist::make_world_comm();  // data-parallel under mpirun
  if (comm->size() > 1) c.comm = comm.get();
  if (o.batch_size == 0) {
    tune_batch(mc, ds, o.progress, *comm, c);
    job = plan_job(mc, c, ds, val, world);
  }
  const int64_t step_samples = c.global_batch(comm->size());
  SAT_CHECK(ds.size() >= step_samples, "fit: dataset '", ds.name(), "' has ", ds.size(),
            " samples, fewer than one step's ", step_samples, " (FitOptions::batch_size ", c.batch,
            c.accum > 1 ? sat::str_cat(" x ", c.accum, " accumulation") : "",
            comm->size() > 1 ? sat::str_cat(" x ", comm->size(), " ranks") : "", ")");

  sat::Trainer* trainer = nullptr;
  Epochs ep;
  ep.per_epoch = std::max<int64_t>(1, sat::BatchLoader::train_steps(ds.size(), c.batch, c.accum, comm->size(),
                                                                      c.last_batch));
  std::vector<EpochLog> logs;
  c.stop_early = [&](const sat::TrainResult& r) {
    if (o.stop_requested && o.stop_requested()) return true;  // the epoch ends after the run
    if (r.steps % ep.per_epoch != 0) return false;
    EpochLog e = ep.close(r.steps / ep.per_epoch, sat::now_seconds());
    if (val) add_validation(e, trainer->evaluate());
    logs.push_back(e);
    return o.on_epoch && !o.on_epoch(e);
  };
  sat::Trainer t(*job, c);
  trainer = &t;
  load_into(model, t);
  ep.started = sat::now_seconds();
  const sat::TrainResult r = t.run([&](const sat::StepMetrics& m) {
    ep.losses.push_back(m.loss);
    if (o.on_step)
      o.on_step(StepLog{m.step, (m.step - 1) / ep.per_epoch + 1, m.loss, m.lr, m.seconds, m.samples_per_second});
  });
  if (!ep.losses.empty()) {  // the last epoch (or the part of one that steps left)
    EpochLog e = ep.close((r.steps - 1) / ep.per_epoch + 1, sat::now_seconds());
    if (r.test) add_validation(e, *r.test);
    logs.push_back(e);
    if (o.on_epoch) o.on_epoch(e);
  }
  if (!model.impl()->weights) {
    model.impl()->config = mc;  // as fitted to the data
    model.impl()->weights = empty_weights(mc);
  }
  copy_weights(t.params(), *model.impl()->weights);
  return history_of(r, c, std::move(logs));
}

// A one-process trainer of `model`'s weights for evaluating `data` in batches of `batch`.
std::unique_ptr<sat::Trainer> eval_trainer(const Model& model, const Dataset& data, int64_t batch,
                                           sat::ModelConfig& mc) {
  SAT_CHECK(batch >= 1, "batch_size: expected 1 or more, got ", batch);
  mc = model.impl()->config;
  SAT_CHECK(model.impl()->weights, "model '", mc.name, "' has no weights yet (fit it or load_weights)");
  check_data(mc, data, "dataset");
  sat::TrainConfig c;
  c.batch = std::min(batch, data.size());  // a dataset smaller than one batch: a batch of them all
  c.shuffle = false;
  c.progress = 0;
  c.last_batch = sat::LastBatch::pad;  // the last batch padded
  const sat::Dataset& ds = *data.impl()->data;
  sat::fit_to_data(mc, ds);  // a built-in takes the data's image shape (its weights must then fit)
  auto t = std::make_unique<sat::Trainer>(mc, c, ds, &ds);
  load_into(model, *t);
  return t;
}

}  // namespace

History fit(Model& model, const Dataset& train, const FitOptions& options) {
  return guarded([&] { return run_fit(model, train, options); });
}

Evaluation evaluate(const Model& model, const Dataset& data, int64_t batch_size) {
  return guarded([&] {
    SAT_CHECK(data.labelled(), "evaluate: dataset '", data.name(), "' has no labels");
    sat::ModelConfig mc;
    const sat::EvalResult r = eval_trainer(model, data, batch_size, mc)->evaluate();
    return Evaluation{r.loss, r.accuracy >= 0 ? r.accuracy : NAN, r.samples};
  });
}

Predictions predict(const Model& model, const Dataset& data, int64_t batch_size) {
  return guarded([&] {
    sat::ModelConfig mc;
    Predictions p;
    eval_trainer(model, data, batch_size, mc)->evaluate([&](const sat::EvalBatch& e) {
      const int64_t per_sample = e.batch.y.numel() / e.batch.y.shape[0];  // T positions for tokens, else 1
      const int64_t rows = e.batch.valid * per_sample;
      p.width = e.classes;
      p.logits.insert(p.logits.end(), e.logits, e.logits + rows * e.classes);
      p.rows += rows;
    });
    return p;
  });
}

std::vector<int64_t> Predictions::labels() const {
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * width;
    out[size_t(r)] = std::max_element(l, l + width) - l;
  }
  return out;
}

std::vector<float> Predictions::probabilities() const {
  std::vector<float> out(logits.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * width;
    const float top = *std::max_element(l, l + width);
    double sum = 0;
    for (int64_t c = 0; c < width; ++c) sum += std::exp(double(l[c] - top));
    for (int64_t c = 0; c < width; ++c) out[size_t(r * width + c)] = float(std::exp(double(l[c] - top)) / sum);
  }
  return out;
}

}  // namespace saturate
