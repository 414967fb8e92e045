#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/alloc.h"
#include "core/rng.h"
#include "core/timer.h"

namespace sat {
namespace {

constexpr int kPrefetch = 2;

void check_data(const ModelConfig& mc, const BuiltModel& m, const Dataset& ds) {
  Shape want = m.x_shape;
  Shape sample = ds.sample_shape();
  Shape got{};
  got.nd = sample.nd + 1;
  got.d[0] = want[0];
  for (int i = 0; i < sample.nd; ++i) got.d[size_t(i + 1)] = sample[i];
  SAT_CHECK(got == want && ds.sample_dtype() == m.x_dtype, "--data: ", ds.name(), " has samples of shape ",
            sample.str(), " but --model ", mc.name, " expects ", (mc.tokens ? "token sequences " : "images "),
            Shape(std::vector<int64_t>(want.d.begin() + 1, want.d.begin() + want.nd)).str());
  SAT_CHECK(ds.num_classes() <= mc.classes, "--data: ", ds.name(), " has ", ds.num_classes(),
            " classes but the model has ", mc.classes, " outputs");
}

std::string format_duration(double s) {
  char b[32];
  if (s < 60) std::snprintf(b, sizeof b, "%.0fs", s);
  else if (s < 3600) std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return b;
}

}  // namespace

DataOptions data_options_for(const ModelConfig& mc, uint64_t seed) {
  DataOptions o;
  o.model_takes_tokens = mc.tokens;
  o.image_shape = mc.image;
  o.num_classes = mc.classes;
  o.seq_len = mc.seq_len;
  o.vocab = mc.vocab;
  o.seed = seed;
  return o;
}

MemoryPlan Trainer::plan_for(const Graph& g, const TrainConfig& cfg, const Dataset& train, const Dataset* test) {
  size_t inputs = BatchLoader::buffer_bytes(train, cfg.batch, kPrefetch);
  if (test && cfg.evaluate) inputs += BatchLoader::buffer_bytes(*test, cfg.batch, kPrefetch);
  return Engine::plan_memory(g, optimizer_slots(resolve_optim(cfg.optim)), inputs);
}

MemoryPlan Trainer::plan(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test) {
  return plan_for(*build_model(mc, cfg.batch, true).graph, cfg, train, test);
}

Trainer::Trainer(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test)
    : mc_(mc), cfg_(cfg), train_(train), test_(cfg.evaluate ? test : nullptr) {
  SAT_CHECK(cfg.batch >= 1, "--batch: expected a positive micro-batch size, got ", cfg.batch);
  SAT_CHECK(cfg.accum >= 1, "--accum: expected a positive number of micro-batches, got ", cfg.accum);
  SAT_CHECK(cfg.steps >= 0 && cfg.epochs >= 0, "--steps/--epochs: expected a non-negative number");
  cfg_.optim = resolve_optim(cfg.optim);
  cfg_.schedule = resolve_schedule(cfg.schedule);
  model_ = build_model(mc, cfg.batch, true);
  check_data(mc, model_, train);
  if (test_) check_data(mc, model_, *test_);
  SAT_CHECK(train.size() >= cfg.batch, "--batch ", cfg.batch, " is larger than the training set (", train.size(),
            " samples of ", train.name(), ")");
  plan_ = plan_for(*model_.graph, cfg_, train, test_);
  mem_base_ = mem_stats().current;
  mem_reset_peak();
  params_ = std::make_unique<ParamStore>(model_.graph->params(), model_.graph->states(), optimizer_slots(cfg_.optim));
  params_->init(cfg.seed);
  engine_ = std::make_unique<Engine>(*model_.graph, *params_);
  opt_ = std::make_unique<Optimizer>(cfg_.optim);
  train_loader_ = std::make_unique<BatchLoader>(train, cfg.batch, cfg.shuffle, cfg.seed, true, kPrefetch);
  if (test_) test_loader_ = std::make_unique<BatchLoader>(*test_, cfg.batch, false, cfg.seed, false, kPrefetch);
}

Trainer::~Trainer() = default;

TrainResult Trainer::run(const std::function<void(const StepMetrics&)>& on_step) {
  TrainResult r;
  const double t_start = now_seconds();
  const int64_t per_epoch = train_loader_->batches_per_epoch();
  SAT_CHECK(per_epoch >= cfg_.accum || cfg_.steps > 0, "--accum ", cfg_.accum, " x --batch ", cfg_.batch,
            " is more than one epoch of ", train_.name(), " (", train_.size(), " samples)");
  const int64_t total = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * (per_epoch / cfg_.accum);
  SAT_CHECK(total >= 1, "--epochs/--steps: nothing to train (", cfg_.steps > 0 ? "0 steps" : "0 epochs", ")");
  const int64_t global_batch = cfg_.batch * cfg_.accum;
  r.warmup_excluded = cfg_.warmup_excluded >= 0 ? cfg_.warmup_excluded : std::min<int64_t>(3, total / 5);
  r.predicted_memory_bytes = plan_.total();

  const bool tty = isatty(STDERR_FILENO);
  const int progress = cfg_.progress >= 0 ? cfg_.progress : (tty ? 2 : 1);
  const int64_t line_every = std::max<int64_t>(1, total / 20);

  std::ofstream metrics;
  if (!cfg_.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.out_dir, ec);
    SAT_CHECK(!ec, "--out: cannot create directory ", cfg_.out_dir, ": ", ec.message());
    metrics.open(cfg_.out_dir + "/metrics.jsonl", std::ios::trunc);
    SAT_CHECK(metrics, "--out: cannot write ", cfg_.out_dir, "/metrics.jsonl");
  }

  int64_t epoch = 0;
  train_loader_->start_epoch(epoch);
  Batch batch;
  double t_measure = 0;
  const double t_train = now_seconds();
  for (int64_t step = 0; step < total; ++step) {
    const double t0 = now_seconds();
    if (step == r.warmup_excluded) {
      t_measure = t0;
      engine_->set_profiling(cfg_.profile);  // time layers after warm-up only
    }
    const float lr = schedule_lr(cfg_.schedule, cfg_.optim.lr, step, total);
    double loss_sum = 0;
    for (int64_t micro = 0; micro < cfg_.accum; ++micro) {
      while (!train_loader_->next(batch)) train_loader_->start_epoch(++epoch);
      engine_->bind(model_.x, batch.x);
      engine_->bind(model_.y, batch.y);
      float loss = engine_->forward(true, mix_seed(cfg_.seed, uint64_t(step * cfg_.accum + micro)));
      engine_->backward(1.0f / float(cfg_.accum), micro == 0);
      loss_sum += loss;
    }
    const double loss = loss_sum / double(cfg_.accum);
    SAT_CHECK(std::isfinite(loss), "training diverged: the loss of step ", step + 1, " is ", loss,
              " (try a smaller --lr)");
    opt_->step(*params_, lr);
    const double dt = now_seconds() - t0;
    StepMetrics m{step + 1, loss, lr, dt, double(global_batch) / dt};
    r.losses.push_back(loss);
    if (metrics.is_open()) {
      char line[256];
      std::snprintf(line, sizeof line, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"samples_per_second\": %.6g, \"seconds\": %.6g}\n",
                    (long long)m.step, m.loss, m.lr, m.samples_per_second, m.seconds);
      metrics << line << std::flush;
    }
    if (on_step) on_step(m);
    if (progress == 2) {
      double frac = double(step + 1) / double(total);
      double elapsed = now_seconds() - t_train;
      int filled = int(frac * 30);
      std::fprintf(stderr, "\r[%.*s%*s] step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s   ", filled,
                   "##############################", 30 - filled, "", (long long)(step + 1), (long long)total, loss,
                   m.samples_per_second, format_duration(elapsed / frac - elapsed).c_str());
      if (step + 1 == total) std::fprintf(stderr, "\n");
    } else if (progress == 1 && ((step + 1) % line_every == 0 || step + 1 == total)) {
      std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3g  %.0f samples/s\n", (long long)(step + 1),
                   (long long)total, loss, double(lr), m.samples_per_second);
    }
  }
  const double t_end = now_seconds();
  engine_->set_profiling(false);
  r.steps = total;
  r.final_train_loss = r.losses.empty() ? NAN : r.losses.back();
  r.train_seconds = t_end - t_train;
  const int64_t measured = total - r.warmup_excluded;
  r.samples_per_second = measured > 0 ? double(measured * global_batch) / (t_end - t_measure) : 0;
  if (test_) {
    if (progress) std::fprintf(stderr, "evaluating on %s (%lld samples)\n", test_->name().c_str(), (long long)test_->size());
    r.test = evaluate();
  }
  r.peak_memory_bytes = mem_stats().peak - mem_base_;
  r.wall_seconds = now_seconds() - t_start;
  return r;
}

EvalResult Trainer::evaluate() {
  SAT_CHECK(test_loader_, "internal error: no test split to evaluate");
  EvalResult e;
  double loss_sum = 0;
  int64_t correct = 0, counted = 0, rows_total = 0;
  const bool classify = !mc_.tokens;
  test_loader_->start_epoch(0);
  Batch b;
  while (test_loader_->next(b)) {
    engine_->bind(model_.x, b.x);
    engine_->bind(model_.y, b.y);
    float loss = engine_->forward(false, 0);
    const int32_t* y = b.y.i32();
    const int64_t rows = b.y.numel();
    int64_t valid = 0;
    for (int64_t i = 0; i < rows; ++i) valid += y[i] >= 0;
    if (valid > 0) loss_sum += double(loss) * double(valid);
    rows_total += valid;
    if (classify) {
      Tensor logits = engine_->value(model_.logits);
      const int64_t C = logits.shape[-1];
      for (int64_t i = 0; i < rows; ++i) {
        if (y[i] < 0) continue;
        const float* l = logits.f32() + i * C;
        int64_t best = 0;
        for (int64_t c = 1; c < C; ++c)
          if (l[c] > l[best]) best = c;
        correct += best == y[i];
        ++counted;
      }
    }
    e.samples += b.valid;
  }
  e.loss = rows_total ? loss_sum / double(rows_total) : NAN;
  if (classify) e.accuracy = counted ? double(correct) / double(counted) : NAN;
  return e;
}

}  // namespace sat
