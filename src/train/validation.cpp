#include "train/validation.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/timer.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/evaluate.h"
#include "train/plan.h"
#include "train/runtime.h"

namespace sat {

namespace fs = std::filesystem;

bool is_best_metric(const std::string& metric) { return metric == "val_loss" || metric == "val_accuracy"; }

bool lower_is_better(const std::string& metric) { return metric == "val_loss"; }

double metric_value(const EvalResult& e, const std::string& metric) {
  if (metric == "val_loss") return e.loss;
  return e.accuracy >= 0 ? e.accuracy : NAN;
}

void check_validation(const ModelConfig& mc, const TrainConfig& cfg) {
  SAT_CHECK(cfg.eval_every >= 0, "--eval-every: expected a number of optimizer steps >= 1, got ", cfg.eval_every);
  SAT_CHECK(cfg.eval_batches >= 0, "--eval-batches: expected a number of batches >= 1, got ", cfg.eval_batches);
  SAT_CHECK(cfg.eval_batches == 0 || cfg.eval_every > 0, "--eval-batches needs --eval-every N (it bounds those "
            "evaluations; the final one reads the whole test split)");
  SAT_CHECK(cfg.eval_every == 0 || cfg.evaluate, "--eval-every needs the test split: not with --eval off");
  if (cfg.keep_best.empty()) return;
  SAT_CHECK(is_best_metric(cfg.keep_best), "--keep-best: expected val_loss (lower is better) or val_accuracy (higher "
            "is better), got '", cfg.keep_best, "'");
  SAT_CHECK(cfg.eval_every > 0, "--keep-best needs --eval-every N (the evaluations it compares)");
  SAT_CHECK(!cfg.best_dir.empty(), "--keep-best needs --out DIR (the best checkpoint goes to DIR/best)");
  SAT_CHECK(cfg.keep_best != "val_accuracy" || !mc.tokens, "--keep-best val_accuracy: --model ", mc.name,
            " is a language model, whose evaluation has a loss (and perplexity) but no accuracy: use val_loss");
}

void check_validation(const TrainConfig& cfg, const Dataset* test, int64_t total) {
  if (cfg.eval_every <= 0) return;
  SAT_CHECK(test, "--eval-every: the data has no validation split to evaluate (give csv:FILE:VAL_FILE or "
            "--val-fraction, tokens:FILE:VAL or *_val_* shards, or image data with its test set)");
  SAT_CHECK(total <= 0 || cfg.eval_every <= total, "--eval-every ", cfg.eval_every, " is more than the run's ", total,
            " optimizer steps: no evaluation would run (give N <= ", total, ")");
}

bool validates_prefix(const TrainConfig& cfg, const Dataset& test) {
  return cfg.eval_every > 0 && cfg.eval_batches > 0 && cfg.eval_batches < (test.size() + cfg.batch - 1) / cfg.batch;
}

namespace {

class Validation final : public RunObserver {
 public:
  Validation(RankRuntime& rt, Checkpointer& checkpoints, RunState& run) : rt_(rt), checkpoints_(checkpoints) {
    const TrainConfig& cfg = rt.cfg;
    check_validation(cfg, rt.test, run.total);
    if (validates_prefix(cfg, *rt.test)) {
      prefix_ = make_prefix(*rt.test, cfg.eval_batches * cfg.batch);
      if (rt.test_loader)  // built as the runtime builds its test loader
        loader_ = std::make_unique<BatchLoader>(*prefix_, cfg.batch, false, cfg.seed, false,
                                                Sharding{rt.mesh->dp_rank(), rt.mesh->dp()}, loader_options(cfg));
    }
    if (!cfg.keep_best.empty() && run.result.resumed_from > 0) resumed_best(run.result);
  }

  void step_ends(StepDone& d, RunState& run) override {
    const int64_t step = d.metrics.step;
    if (step % rt_.cfg.eval_every != 0) return;
    const double t0 = now_seconds();
    const EvalResult e = evaluate_now();
    d.metrics.val = e;
    run.result.validations.emplace_back(step, e);
    if (!rt_.cfg.keep_best.empty() && improves(e, run.result)) {
      checkpoints_.save_best(step, run.total, run.result.losses, rt_.cfg.best_dir, rt_.cfg.keep_best,
                             metric_value(e, rt_.cfg.keep_best));
      run.result.best_step = step;
      run.result.best_value = metric_value(e, rt_.cfg.keep_best);
      d.metrics.val_kept = rt_.cfg.best_dir;
    }
    // Not training time: left out of the measured speed (and of --time-limit's clock).
    const double spent = now_seconds() - t0;
    run.result.validation_seconds += spent;
    if (run.measured()) run.t_measure += spent;
  }

 private:
  // The final evaluation's path: the first replica's model states (BatchNorm's statistics),
  // then every rank evaluates; every rank takes rank 0's figures.
  EvalResult evaluate_now() {
    rt_.sync_states_from_first_replica();
    EvalResult e = prefix_ ? evaluate(rt_, *prefix_, loader_.get()) : evaluate(rt_);
    double v[3] = {e.loss, e.accuracy, double(e.samples)};
    if (rt_.world->size() > 1) rt_.world->broadcast_sync(v, 3, DType::f64, 0);
    return {v[0], v[1], int64_t(v[2])};
  }

  bool improves(const EvalResult& e, const TrainResult& r) const {
    const double v = metric_value(e, rt_.cfg.keep_best);
    if (!std::isfinite(v)) return false;
    if (r.best_step == 0) return true;
    return lower_is_better(rt_.cfg.keep_best) ? v < r.best_value : v > r.best_value;
  }

  // A resumed run goes on with the best its best_dir holds (rank 0 reads it, every rank
  // takes its figures): a worse evaluation does not replace it.
  void resumed_best(TrainResult& r) {
    const TrainConfig& cfg = rt_.cfg;
    double v[2] = {0, NAN};
    if (rt_.world->rank() == 0 && fs::exists(fs::path(cfg.best_dir) / "manifest.json")) {
      std::string note;
      try {
        const Manifest m = read_manifest(cfg.best_dir);
        if (m.best_metric == cfg.keep_best) v[0] = double(m.step), v[1] = m.best_value;
        else note = "it was kept by " + (m.best_metric.empty() ? std::string("no metric") : m.best_metric);
      } catch (const Error& e) {
        note = e.what();
      }
      if (!note.empty() && cfg.progress != 0)
        std::fprintf(stderr, "--keep-best: %s is not this run's best (%s): the first evaluation replaces it\n",
                     cfg.best_dir.c_str(), note.c_str());
    }
    if (rt_.world->size() > 1) rt_.world->broadcast_sync(v, 2, DType::f64, 0);
    r.best_step = int64_t(v[0]);
    r.best_value = v[1];
  }

  RankRuntime& rt_;
  Checkpointer& checkpoints_;
  std::unique_ptr<Dataset> prefix_;
  std::unique_ptr<BatchLoader> loader_;
};

}  // namespace

std::unique_ptr<RunObserver> validation_observer(RankRuntime& rt, Checkpointer& checkpoints, RunState& run) {
  return std::make_unique<Validation>(rt, checkpoints, run);
}

}  // namespace sat
