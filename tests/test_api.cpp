// saturate as a library (include/saturate/): a Sequential is the model file it writes; fit
// follows `saturate train`'s trajectory for the same settings; validation after each epoch
// leaves training as it was; predict agrees with evaluate; weights round-trip; arrays and
// token windows train; under mpirun fit is data-parallel and follows one process; every
// mistake is a saturate::Error naming its part; a model file's text and weights by name make
// a model; plan_json and info_json are the commands' JSON.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <saturate/saturate.h>
#include <string>
#include <vector>

#include "run_command.h"

#ifndef SAT_MPIEXEC
#define SAT_MPIEXEC "mpirun --oversubscribe"
#endif

namespace {

namespace fs = std::filesystem;
using namespace saturate;

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sat_api_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string g9(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

FitOptions quiet(int64_t batch, int64_t steps = 0, int64_t epochs = 1) {
  FitOptions o;
  o.batch_size = batch;
  o.steps = steps;
  o.epochs = epochs;
  o.threads = 1;
  o.progress = false;
  return o;
}

// The message of the saturate::Error that fn throws ("" when it throws none).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const saturate::Error& e) {
    return e.what();
  }
  return "";
}

// Two Gaussian blobs in 4 features, [1, 1, 4] samples: class 1 around +1, class 0 around -1.
Dataset blobs(int64_t n, uint64_t seed) {
  std::mt19937 rng{static_cast<unsigned>(seed)};
  std::normal_distribution<float> noise(0.0f, 0.5f);
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t c = int32_t(i % 2);
    for (int k = 0; k < 4; ++k) x.push_back((c ? 1.0f : -1.0f) + noise(rng));
    y.push_back(c);
  }
  return Dataset::from_arrays(x, {1, 1, 4}, y, 2, "blobs");
}

// For the blobs: a rate that learns them within an epoch or two.
FitOptions blob_fit(int64_t epochs, int64_t batch = 32) {
  FitOptions o = quiet(batch, 0, epochs);
  o.optimizer.lr = 2e-2;
  return o;
}

Model small_mlp() {
  return Sequential({1, 1, 4}, "small-mlp").add(Flatten()).add(Linear(16)).add(ReLU()).add(Linear(2)).build();
}

}  // namespace

// The Sequential of the mlp preset writes the file that describes it: the same parameters,
// and the file trains on the command line.
TEST(Library, SequentialIsTheModelFileItWrites) {
  const Sequential net = Sequential({1, 28, 28}, "mlp-seq")
                             .add(Flatten())
                             .add(Linear(1024))
                             .add(ReLU())
                             .add(Linear(1024))
                             .add(ReLU())
                             .add(Linear(10));
  const Model built = net.build();
  const Model preset = Model::load("mlp");
  EXPECT_EQ(built.parameters(), preset.parameters());
  EXPECT_EQ(built.parameters(), 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  EXPECT_EQ(built.input_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(built.classes(), 10);
  const fs::path dir = tmpdir("seq");
  const fs::path file = dir / "net.json";
  std::ofstream(file) << net.json();
  const Model loaded = Model::load(file.string());  // a path ending in .json is a model file
  EXPECT_EQ(loaded.parameters(), built.parameters());
  const auto r = sat::test::run_command(std::string(SAT_BINARY) + " info --model file:" + file.string() + " --batch 8");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1863690"), std::string::npos) << r.out;  // the parameter count
  fs::remove_all(dir);
}

// mlp on synthetic data, batch 16, seed 5: fit's losses against saturate train's with the
// same flags, digit for digit (the CLI keeps this process's BLAS kernels).
History expect_fit_is_the_cli(Model& model, int64_t steps, const std::string& precision,
                              const OptimizerOptions* optimizer = nullptr, const std::string& flags = "") {
  const Data data = load_data("synthetic", model, 5);
  FitOptions o = quiet(16, steps);
  o.seed = 5;
  o.precision = precision;
  if (optimizer) o.optimizer = *optimizer;
  const History h = fit(model, data.train, o);
  EXPECT_EQ(h.loss.size(), size_t(steps));
  const fs::path out = tmpdir("cli_" + precision);
  const auto r = sat::test::run_command("SAT_BLAS_KERNELS=keep " + std::string(SAT_BINARY) +
                                        " train --model mlp --data synthetic --batch 16 --steps " +
                                        std::to_string(steps) + " --seed 5 --precision " + precision +
                                        " --threads 1 --eval off " + flags + " --out " + out.string());
  EXPECT_EQ(r.status, 0) << r.out;
  std::ifstream f(out / "metrics.jsonl");
  std::vector<std::string> cli;
  for (std::string line; std::getline(f, line);) cli.push_back(g9(nlohmann::json::parse(line)["loss"].get<double>()));
  EXPECT_EQ(cli.size(), h.loss.size());
  for (size_t i = 0; i < std::min(cli.size(), h.loss.size()); ++i) EXPECT_EQ(g9(h.loss[i]), cli[i]) << "step " << i + 1;
  fs::remove_all(out);
  return h;
}

// fit is saturate train: the same model, data, batch, seed and default optimizer give the
// same losses.
TEST(Library, FitFollowsTheCommandLine) {
  Model model = Model::load("mlp");
  const History h = expect_fit_is_the_cli(model, 12, "fp32");
  EXPECT_TRUE(model.has_weights());
  EXPECT_EQ(h.batch_size, 16);
  EXPECT_GT(h.predicted_memory_bytes, 0u);
}

// FitOptions::precision "bf16" is saturate train --precision bf16, step for step.
TEST(Library, FitInBf16FollowsTheCommandLine) {
  Model model = Model::load("mlp"), fp32 = Model::load("mlp");
  const History h = expect_fit_is_the_cli(model, 8, "bf16");
  const History h32 = expect_fit_is_the_cli(fp32, 8, "fp32");
  EXPECT_NE(g9(h32.loss.back()), g9(h.loss.back())) << "bf16 gave float32's loss: nothing was rounded";
  EXPECT_EQ(h.peak_memory_bytes, h.predicted_memory_bytes);
  FitOptions o = quiet(16, 8);
  o.precision = "fp16";
  EXPECT_NE(error_of([&] { fit(model, load_data("synthetic", model, 5).train, o); }).find("FitOptions::precision"),
            std::string::npos);
}

// The optimizer's settings are saturate train's flags: AdamW's betas and eps with clipping,
// and SGD with Nesterov momentum.
TEST(Library, FitOptimizerSettingsFollowTheCommandLine) {
  OptimizerOptions adamw;
  adamw.beta1 = 0.8, adamw.beta2 = 0.99, adamw.eps = 1e-6, adamw.clip_grad_norm = 0.5;
  Model a = Model::load("mlp");
  expect_fit_is_the_cli(a, 6, "fp32", &adamw, "--betas 0.8,0.99 --eps 1e-6 --clip-grad-norm 0.5");
  OptimizerOptions sgd;
  sgd.name = "sgd", sgd.lr = 0.05, sgd.momentum = 0.9, sgd.nesterov = true;
  Model s = Model::load("mlp");
  expect_fit_is_the_cli(s, 6, "fp32", &sgd, "--optimizer sgd --lr 0.05 --momentum 0.9 --nesterov");
  FitOptions o = quiet(16, 2);
  o.optimizer.nesterov = true;
  EXPECT_NE(error_of([&] { fit(s, load_data("synthetic", s, 5).train, o); }).find("FitOptions::optimizer.nesterov"),
            std::string::npos);
  o.optimizer = {};
  o.optimizer.beta2 = 1.0;
  EXPECT_NE(error_of([&] { fit(s, load_data("synthetic", s, 5).train, o); }).find("FitOptions::optimizer.beta1/beta2"),
            std::string::npos);
}

// Validation after every epoch runs through the trainer's evaluation between steps and
// changes nothing of training; the last epoch's figures are evaluate's; on_epoch stops.
TEST(Library, ValidationEachEpochLeavesTrainingAsItWas) {
  const Dataset train = blobs(256, 1), val = blobs(96, 2);
  Model plain = small_mlp(), checked = small_mlp();
  const History a = fit(plain, train, blob_fit(3));
  FitOptions o = blob_fit(3);
  o.validation = val;
  std::vector<int64_t> steps_seen;
  o.on_step = [&](const StepLog& s) { steps_seen.push_back(s.step); };
  const History b = fit(checked, train, o);
  ASSERT_EQ(a.loss.size(), 24u);  // 256 / 32 = 8 steps an epoch
  EXPECT_EQ(a.loss, b.loss);      // bitwise
  ASSERT_EQ(b.epochs.size(), 3u);
  EXPECT_EQ(steps_seen.size(), 24u);
  for (const EpochLog& e : b.epochs) {
    EXPECT_TRUE(std::isfinite(e.val_loss)) << "epoch " << e.epoch;
    EXPECT_GE(e.val_accuracy, 0.0);
  }
  EXPECT_TRUE(std::isnan(a.epochs.back().val_loss));
  EXPECT_DOUBLE_EQ(b.epochs[0].loss, std::accumulate(b.loss.begin(), b.loss.begin() + 8, 0.0) / 8);
  // At the fit's batch size: the same products in the same shapes (a BLAS may sum a row's
  // products in an order that depends on the number of rows, so 64 would differ in the last bits).
  const Evaluation ev = evaluate(checked, val, 32);
  EXPECT_EQ(ev.loss, b.epochs.back().val_loss);
  EXPECT_EQ(ev.accuracy, b.epochs.back().val_accuracy);
  EXPECT_EQ(ev.samples, 96);
  EXPECT_GE(ev.accuracy, 0.95);  // the blobs are 2.8 standard deviations apart per feature

  Model stopped = small_mlp();
  FitOptions s = blob_fit(3);
  s.validation = val;
  s.on_epoch = [](const EpochLog& e) { return e.epoch < 2; };
  const History c = fit(stopped, train, s);
  EXPECT_EQ(c.loss.size(), 16u);
  ASSERT_EQ(c.epochs.size(), 2u);
  EXPECT_EQ(c.epochs[1].epoch, 2);
  EXPECT_EQ(std::vector<double>(b.loss.begin(), b.loss.begin() + 16), c.loss);
}

// predict's labels give evaluate's accuracy; its rows are the samples, softmax rows sum to 1;
// unlabelled data predicts the same.
TEST(Library, PredictAgreesWithEvaluate) {
  const Dataset train = blobs(256, 3), test = blobs(70, 4);  // 70: a partial last batch
  Model m = small_mlp();
  fit(m, train, blob_fit(2));
  const Predictions p = predict(m, test, 32);
  ASSERT_EQ(p.rows, 70);
  ASSERT_EQ(p.width, 2);
  const std::vector<int64_t> labels = p.labels();
  int64_t right = 0;
  for (int64_t i = 0; i < 70; ++i) right += labels[size_t(i)] == i % 2;
  EXPECT_DOUBLE_EQ(double(right) / 70, evaluate(m, test, 32).accuracy);
  const std::vector<float> prob = p.probabilities();
  for (int64_t i = 0; i < 70; ++i) EXPECT_NEAR(prob[size_t(2 * i)] + prob[size_t(2 * i + 1)], 1.0f, 1e-6f);

  std::vector<float> x;
  for (int64_t i = 0; i < 70; ++i)  // the same samples without labels
    for (float v : std::vector<float>{i % 2 ? 1.0f : -1.0f, 0.0f, 0.0f, 0.0f}) x.push_back(v);
  const Dataset bare = Dataset::from_arrays(x, {1, 1, 4}, {}, 2, "bare");
  EXPECT_FALSE(bare.labelled());
  const Predictions q = predict(m, bare);
  ASSERT_EQ(q.rows, 70);
  for (int64_t i = 0; i < 70; ++i) EXPECT_EQ(q.labels()[size_t(i)], i % 2) << "sample " << i;
}

// save writes safetensors that load_weights (and saturate eval) read back; fit goes on from
// the model's weights.
TEST(Library, WeightsRoundTripAndFitContinues) {
  const Dataset train = blobs(256, 5), test = blobs(64, 6);
  Model m = small_mlp();
  EXPECT_FALSE(m.has_weights());
  const History first = fit(m, train, blob_fit(2));
  const fs::path dir = tmpdir("weights");
  const std::string file = (dir / "m.safetensors").string();
  m.save(file);
  Model back = small_mlp();
  back.load_weights(file);
  EXPECT_EQ(back.weight("linear1.weight"), m.weight("linear1.weight"));
  EXPECT_EQ(back.weight_names(), m.weight_names());
  const Evaluation a = evaluate(m, test), b = evaluate(back, test);
  EXPECT_EQ(a.loss, b.loss);
  const History more = fit(m, train, blob_fit(1));
  EXPECT_LT(more.loss.front(), first.loss.front() * 0.5) << "the second fit started afresh";
  EXPECT_NE(m.weight("linear1.weight"), back.weight("linear1.weight"));
  fs::remove_all(dir);
}

// A token model from a family spec trains on token windows given as arrays; predict gives
// a row of next-token logits per position.
TEST(Library, TokenWindowsTrain) {
  Model gpt = Model::load("gpt:layers=1,heads=2,width=32,context=16,vocab=64");
  EXPECT_TRUE(gpt.takes_tokens());
  std::vector<int32_t> tok, next;
  for (int64_t w = 0; w < 64; ++w)  // a counting sequence: each next token is the token + 1
    for (int64_t t = 0; t < 16; ++t) tok.push_back(int32_t((w + t) % 64)), next.push_back(int32_t((w + t + 1) % 64));
  const Dataset d = Dataset::from_tokens(tok, 16, next, 64, "counting");
  FitOptions o = quiet(8, 0, 6);
  o.optimizer.lr = 1e-2;
  const History h = fit(gpt, d, o);
  EXPECT_LT(h.loss.back(), 0.25 * h.loss.front());  // 4.19 to 0.46 measured
  const Predictions p = predict(gpt, d.slice(0, 4), 4);
  EXPECT_EQ(p.rows, 4 * 16);
  EXPECT_EQ(p.width, 64);
}

// batch_size 0: the tuner measures and chooses; the run trains with its choice.
TEST(Library, TheTunerChoosesTheBatch) {
  Model m = small_mlp();
  FitOptions o = quiet(0, 20);
  const History h = fit(m, blobs(4096, 7), o);
  EXPECT_GE(h.batch_size, 1);
  EXPECT_EQ(h.steps, 20);
  std::printf("[ library ] batch_size 0: the tuner chose micro-batch %lld x %lld\n", (long long)h.batch_size,
              (long long)h.accumulation);
}

TEST(Library, MistakesAreErrorsNamingTheirPart) {
  auto has = [](const std::string& msg, const std::vector<std::string>& parts) {
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  has(error_of([] { Sequential({1, 1, 4}, "n").add(Layer("linear", R"({"outt": 3})")).build(); }),
      {"model 'n'", "layer 'linear1' (linear)", "outt"});
  has(error_of([] { Sequential({1, 1, 4}, "n").add(Layer("lineer")).build(); }), {"layer 'lineer1'", "lineer"});
  has(error_of([] { Sequential({1, 1, 4}, "n").add(Layer("linear", "{out: 3")).build(); }),
      {"layer 'linear1' (linear)", "JSON object"});
  has(error_of([] { Sequential({1, 1, 4}, "n").add(Linear(3).reads({"nowhere"})).build(); }), {"nowhere"});
  has(error_of([] { Model::load("/nonexistent/net.json"); }), {"/nonexistent/net.json"});
  has(error_of([] { Dataset::from_arrays({1, 2, 3}, {1, 1, 2}, {0}, 2); }), {"not a whole number", "[1, 1, 2]"});
  has(error_of([] { Dataset::from_arrays({1, 2}, {1, 1, 2}, {7}, 2); }), {"label 0 is 7"});
  Model m = small_mlp();
  has(error_of([&] { fit(m, Dataset::from_arrays(std::vector<float>(50), {1, 1, 5}, std::vector<int32_t>(10), 2), quiet(2)); }),
      {"has samples of shape [1, 1, 5]", "takes [1, 1, 4]"});
  has(error_of([&] { fit(m, blobs(64, 1), quiet(-1)); }), {"FitOptions::batch_size"});
  has(error_of([&] { fit(m, blobs(16, 1), quiet(32)); }), {"16 samples", "FitOptions::batch_size 32"});
  has(error_of([&] { evaluate(m, blobs(16, 1)); }), {"has no weights"});
  has(error_of([&] { fit(m, Dataset::from_arrays(std::vector<float>(8), {1, 1, 4}, {}, 2), quiet(2)); }), {"no labels"});
  has(error_of([&] { m.save("/tmp/x.safetensors"); }), {"no weights to save"});
  has(error_of([&] { m.load_weights("/nonexistent.safetensors"); }), {"/nonexistent.safetensors"});
  has(error_of([&] { blobs(8, 1).slice(4, 8); }), {"slice [4, 12)", "8 samples"});
  has(error_of([&] {
        FitOptions o = quiet(8);
        o.optimizer.name = "adam";
        fit(m, blobs(64, 1), o);
      }),
      {"FitOptions::optimizer.name", "'adam'"});
  fit(m, blobs(64, 1), quiet(8));
  has(error_of([&] { m.weight("linear9.weight"); }), {"no weight named 'linear9.weight'"});
  has(error_of([&] { Model::load("gpt:layers=2"); }), {"gpt:layers=2"});
}

// A model from a model file's text is the model the file describes; set_weights checks every
// name and size before it writes any, and a model without weights needs them all.
TEST(Library, FromJsonAndSetWeights) {
  const Sequential seq = Sequential({1, 1, 4}, "small-mlp").add(Flatten()).add(Linear(16)).add(ReLU()).add(Linear(2));
  Model m = small_mlp(), copy = Model::from_json(seq.json(), "small-mlp");
  EXPECT_EQ(copy.json(), seq.json());
  EXPECT_EQ(copy.parameters(), m.parameters());
  EXPECT_EQ(Model::load("mlp").json(), "");
  EXPECT_EQ(copy.weight_shape("linear1.weight"), (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(copy.declared_weights().size(), 4u);
  fit(m, blobs(64, 1), quiet(16));
  std::map<std::string, std::vector<float>> w;
  for (const std::string& n : m.weight_names()) w[n] = m.weight(n);
  auto partial = w;
  partial.erase("linear2.bias");
  EXPECT_NE(error_of([&] { copy.set_weights(partial); }).find("'linear2.bias' is missing"), std::string::npos);
  EXPECT_FALSE(copy.has_weights());
  copy.set_weights(w);
  const Dataset d = blobs(32, 2);
  EXPECT_EQ(predict(copy, d).logits, predict(m, d).logits);
  auto bad = w;
  bad["linear1.weight"].pop_back();
  bad["linear2.bias"] = {5, 5};
  EXPECT_NE(error_of([&] { copy.set_weights(bad); }).find("weight 'linear1.weight' has 64 values (shape [16, 4]), got 63"),
            std::string::npos);
  EXPECT_EQ(copy.weight("linear2.bias"), w["linear2.bias"]) << "a refused set_weights wrote some of them";
  copy.set_weights({{"linear2.bias", {5, 5}}});
  EXPECT_EQ(copy.weight("linear2.bias"), (std::vector<float>{5, 5}));
  EXPECT_EQ(copy.weight("linear1.weight"), w["linear1.weight"]);
}

// plan_json is `saturate plan --json`'s file; info_json's memory rows sum to its total.
TEST(Library, PlanAndInfoAreTheCommandsJson) {
  const std::string spec = "gpt:layers=1,heads=2,width=32,context=8,vocab=64";
  const fs::path dir = tmpdir("plan");
  const auto r = sat::test::run_command(std::string(SAT_BINARY) + " plan --model " + spec +
                                        " --gpus 2 --gpu h100-sxm --global-batch 16 --json " + (dir / "p.json").string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream f(dir / "p.json");
  nlohmann::json cli = nlohmann::json::parse(f);
  PlanOptions o;
  o.gpus = 2, o.gpu = "h100-sxm", o.global_batch = 16;
  nlohmann::json lib = nlohmann::json::parse(plan_json(Model::load(spec), o));
  cli.erase("search_seconds"), lib.erase("search_seconds");
  EXPECT_EQ(cli, lib);
  InfoOptions io;
  io.batch = 8;
  const nlohmann::json info = nlohmann::json::parse(info_json(small_mlp(), io));
  EXPECT_EQ(info["parameters"], small_mlp().parameters());
  double sum = 0;
  for (const auto& row : info["memory"]) sum += row["bytes"].get<double>();
  EXPECT_EQ(sum, info["total_bytes"].get<double>());
  o.global_batch = 0;
  EXPECT_NE(error_of([&] { plan_json(small_mlp(), o); }).find("--global-batch"), std::string::npos);
  fs::remove_all(dir);
}

// Under mpirun each rank calls fit alike and trains data-parallel: 2 ranks at batch 8 follow
// one process at batch 16 (the same global batch) within 1e-5.
TEST(Library, DataParallelUnderMpirunFollowsOneProcess) {
#if !SAT_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI (apt-get install libopenmpi-dev openmpi-bin)";
#endif
  const fs::path dir = tmpdir("dp");
  const std::string out = (dir / "ranks.txt").string();
  const auto r = sat::test::run_command(
      "env -i PATH=/usr/bin:/bin HOME=/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMP_WAIT_POLICY=passive SAT_API_DP_OUT=" + out + " timeout -k 5 180 " SAT_MPIEXEC " -np 2 " +
      fs::read_symlink("/proc/self/exe").string() + " --gtest_filter=LibraryRanks.FitTwoRanks");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream f(out);
  std::vector<double> two;
  for (double v; f >> v;) two.push_back(v);
  Model m = small_mlp();
  FitOptions o = quiet(16, 12);
  o.shuffle = false;
  const History one = fit(m, blobs(512, 9), o);
  ASSERT_EQ(two.size(), one.loss.size()) << r.out;
  for (size_t i = 0; i < two.size(); ++i) EXPECT_NEAR(two[i], one.loss[i], 1e-5 * std::fabs(one.loss[i])) << i;
  fs::remove_all(dir);
}

// The ranks of the test above (skipped unless it starts them).
TEST(LibraryRanks, FitTwoRanks) {
  const char* out = std::getenv("SAT_API_DP_OUT");
  if (!out) GTEST_SKIP() << "run by Library.DataParallelUnderMpirunFollowsOneProcess under mpirun";
  Model m = small_mlp();
  FitOptions o = quiet(8, 12);
  o.shuffle = false;
  const History h = fit(m, blobs(512, 9), o);
  ASSERT_EQ(h.processes, 2);
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank && std::string(rank) == "0") {
    std::ofstream f(out);
    for (double l : h.loss) f << g9(l) << "\n";
  }
}
