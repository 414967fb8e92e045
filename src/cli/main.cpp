// The `saturate` command: train and info. User mistakes print one clear line and
// exit with status 2; nothing is written over until a run has succeeded.
#include <strings.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "backend/cpu/blas.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "nn/engine.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "backend/device.h"
#include "dist/bench_comm.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "train/trainer.h"

extern "C" char* openblas_get_corename(void);

namespace {

using nlohmann::ordered_json;

// OpenBLAS 0.3.21 (Debian 12) does not recognise recent AVX-512 CPUs (AMD Zen 4/5)
// and falls back to its AVX2 "Haswell" kernels, 1.4-1.9x slower in sgemm. It picks
// its kernels when the library loads, so set OPENBLAS_CORETYPE and re-execute once.
// OpenBLAS itself writes the detected core into OPENBLAS_CORETYPE at load, so a value
// that differs from the detected core is the user's own choice and is kept;
// SAT_BLAS_KERNELS=keep turns the selection off.
void select_blas_kernels(char** argv) {
  const char* keep = std::getenv("SAT_BLAS_KERNELS");
  if ((keep && std::string(keep) == "keep") || std::getenv("SAT_BLAS_REEXEC")) return;
  const char* core = openblas_get_corename();
  if (!core) return;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env && strcasecmp(env, core) != 0) return;
  bool fallback = std::string(core) == "Haswell" || std::string(core) == "Zen";
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!fallback || !avx512) return;
  setenv("OPENBLAS_CORETYPE", "SKYLAKEX", 1);
  setenv("SAT_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // on failure, carry on with the default kernels
}

struct TrainArgs {
  std::string model = "mlp", data = "fashion-mnist", optimizer = "sgd", schedule = "constant", shuffle = "on";
  int64_t batch = 64, accum = 1, epochs = 1, steps = 0, warmup = 0, step_size = 0, vocab = 0;
  // NaN: not given (the optimizer's default applies)
  double lr = std::nan(""), momentum = 0, weight_decay = std::nan(""), gamma = 0.1;
  bool nesterov = false, profile = false;
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "auto", precision = "fp32", cuda_graph = "on", last_batch = "drop";
  double bucket_mb = 25;
  bool sync_bn = false;
  int zero = 0;
  std::string init_weights, save_weights, out, normalize, eval = "on";
};

void write_json_atomic(const std::string& path, const ordered_json& j) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    SAT_CHECK(f, "--out: cannot write ", tmp);
    f << j.dump(2) << "\n";
    SAT_CHECK(f.good(), "--out: writing ", tmp, " failed");
  }
  std::filesystem::rename(tmp, path);
}

sat::ModelConfig model_for(const TrainArgs& a) {
  sat::ModelConfig mc = sat::model_config(a.model);
  if (a.vocab > 0) {
    SAT_CHECK(mc.tokens, "--vocab applies to the GPT models only, not --model ", a.model);
    mc.vocab = mc.classes = a.vocab;
  }
  return mc;
}

ordered_json plan_json(const sat::MemoryPlan& p) {
  ordered_json j;
  for (int k = 0; k < int(sat::MemKind::kCount); ++k) j[sat::mem_kind_name(sat::MemKind(k))] = p.by_kind[size_t(k)];
  j["persistent"] = p.persistent;
  j["transient_arena"] = p.transient;
  j["inputs"] = p.inputs;
  j["total"] = p.total();
  return j;
}

int run_train(const TrainArgs& a) {
  const double t0 = sat::now_seconds();
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (all cores) or a positive number, got ", a.threads);
  sat::cpu::set_num_threads(a.threads);
  sat::ModelConfig mc = model_for(a);
  SAT_CHECK(a.shuffle == "on" || a.shuffle == "off", "--shuffle: expected on or off, got '", a.shuffle, "'");
  SAT_CHECK(a.eval == "on" || a.eval == "off", "--eval: expected on or off, got '", a.eval, "'");
  if (!a.init_weights.empty())
    SAT_CHECK(std::filesystem::exists(a.init_weights), "--init-weights: ", a.init_weights, " does not exist");
  if (!a.save_weights.empty()) {
    auto dir = std::filesystem::path(a.save_weights).parent_path();
    SAT_CHECK(dir.empty() || std::filesystem::is_directory(dir), "--save-weights: directory ", dir.string(), " does not exist");
  }

  sat::DataOptions dopt = sat::data_options_for(mc, a.seed);
  if (!a.normalize.empty()) sat::parse_normalize(a.normalize, dopt);
  sat::DataSplit data = sat::open_dataset(a.data, dopt);
  // Image data of another shape (synthetic:CxHxW, CIFAR for mlp...) sets the model's input.
  if (!mc.tokens) {
    mc.image = data.train->sample_shape();
    mc.classes = data.train->num_classes();
  }

  sat::TrainConfig cfg;
  cfg.batch = a.batch;
  cfg.accum = a.accum;
  cfg.epochs = a.epochs;
  cfg.steps = a.steps;
  cfg.optim.name = a.optimizer;
  cfg.optim.lr = float(std::isnan(a.lr) ? (a.optimizer == "adamw" ? 1e-3 : 0.01) : a.lr);
  cfg.optim.momentum = float(a.momentum);
  cfg.optim.nesterov = a.nesterov;
  SAT_CHECK(std::isnan(a.weight_decay) || a.weight_decay >= 0, "--weight-decay: expected a number >= 0, got ", a.weight_decay);
  cfg.optim.weight_decay = std::isnan(a.weight_decay) ? -1.0f : float(a.weight_decay);  // < 0: PyTorch's default
  cfg.schedule.name = a.schedule;
  cfg.schedule.warmup = a.warmup;
  cfg.schedule.step_size = a.step_size;
  cfg.schedule.gamma = float(a.gamma);
  cfg.seed = a.seed;
  cfg.shuffle = a.shuffle == "on";
  cfg.evaluate = a.eval == "on";
  cfg.out_dir = a.out;
  cfg.profile = a.profile;
  cfg.device = a.device;
  cfg.precision = a.precision;
  SAT_CHECK(a.cuda_graph == "on" || a.cuda_graph == "off", "--cuda-graph: expected on or off, got '", a.cuda_graph, "'");
  cfg.cuda_graph = a.cuda_graph == "on";
  SAT_CHECK(a.last_batch == "drop" || a.last_batch == "pad", "--last-batch: expected drop or pad, got '", a.last_batch, "'");
  cfg.last_batch = a.last_batch == "pad" ? sat::LastBatch::pad : sat::LastBatch::drop;
  cfg.bucket_mb = a.bucket_mb;
  cfg.sync_bn = a.sync_bn;
  cfg.zero = a.zero;
  // Under mpirun/srun: one communicator for the job; only rank 0 prints and writes.
  std::unique_ptr<sat::dist::Comm> comm = sat::dist::make_world_comm();
  cfg.comm = comm.get();
  const bool lead = comm->rank() == 0;
  const int world = comm->size();
  if (!lead) {
    cfg.progress = 0;
    cfg.out_dir.clear();
  }

  SAT_CHECK(a.init_weights.empty() || a.device == "cpu" || sat::resolve_device(a.device) == sat::Device::cpu,
            "--init-weights with --device cuda is not supported yet: load on the CPU (--device cpu)");
  if (lead) std::fprintf(stderr, "saturate train: %s on %s\n", mc.name.c_str(), data.description.c_str());
  sat::Trainer trainer(mc, cfg, *data.train, data.test.get());
  if (!a.init_weights.empty()) sat::load_safetensors(a.init_weights, trainer.params());
  const auto& plan = trainer.memory_plan();
  if (lead)
    std::fprintf(stderr, "%lld parameters, micro-batch %lld x %lld accumulation x %d rank(s), %d threads, predicted memory %s\n",
                 (long long)trainer.params().param_count(), (long long)a.batch, (long long)a.accum, world,
                 sat::cpu::num_threads(), sat::format_bytes(double(plan.device ? plan.device : plan.total())).c_str());
  sat::TrainResult r = trainer.run();
  if (!lead) return 0;
  if (a.profile) std::fprintf(stderr, "%s", trainer.profile_report().c_str());
  if (!a.save_weights.empty()) {
    sat::save_safetensors(a.save_weights, trainer.params(), mc.name);
    std::fprintf(stderr, "saved weights to %s\n", a.save_weights.c_str());
  }

  const int64_t gb = r.global_batch;
  std::printf("final train loss %.4f", r.final_train_loss);
  if (r.test) {
    std::printf(", test loss %.4f", r.test->loss);
    if (r.test->accuracy >= 0) std::printf(", test accuracy %.2f%% (%lld samples)", 100 * r.test->accuracy, (long long)r.test->samples);
  }
  std::printf("\n%.1f samples/s (%lld warm-up steps excluded), memory predicted %s, peak %s\n", r.samples_per_second,
              (long long)r.warmup_excluded, sat::format_bytes(double(r.predicted_memory_bytes)).c_str(),
              sat::format_bytes(double(r.peak_memory_bytes)).c_str());

  if (!a.out.empty()) {
    ordered_json s;
    s["model"] = mc.name;
    s["parameters"] = trainer.params().param_count();
    s["data"] = data.description;
    s["device"] = r.device;
    if (!r.device_name.empty()) s["device_name"] = r.device_name;
    s["precision"] = r.precision;
    s["threads"] = sat::cpu::num_threads();
    s["batch"] = a.batch;
    s["accum"] = a.accum;
    s["global_batch"] = gb;
    s["world_size"] = r.world_size;
    s["comm_seconds"] = r.comm_seconds;
    s["comm_hidden_fraction"] = r.comm_hidden_fraction;
    s["rank_step_seconds"] = r.rank_step_seconds;
    s["sync_bn"] = a.sync_bn;
    s["zero"] = a.zero;
    s["optimizer_state_bytes"] = plan.by_kind[size_t(sat::MemKind::optimizer_state)];
    s["steps"] = r.steps;
    s["optimizer"] = {{"name", cfg.optim.name}, {"lr", cfg.optim.lr}, {"momentum", cfg.optim.momentum},
                      {"nesterov", cfg.optim.nesterov}, {"weight_decay", sat::resolve_optim(cfg.optim).weight_decay}};
    s["schedule"] = {{"name", a.schedule}, {"warmup", a.warmup}};
    s["seed"] = a.seed;
    s["final_train_loss"] = r.final_train_loss;
    if (r.test) {
      s["test_loss"] = r.test->loss;
      if (r.test->accuracy >= 0) s["test_accuracy"] = r.test->accuracy;
      s["test_samples"] = r.test->samples;
    }
    s["samples_per_second"] = r.samples_per_second;
    s["samples_per_second_note"] = "excludes the first " + std::to_string(r.warmup_excluded) + " steps (warm-up)";
    s["warmup_steps_excluded"] = r.warmup_excluded;
    if (mc.tokens) s["tokens_per_second"] = r.samples_per_second * double(mc.seq_len);
    s["flops_per_sample"] = sat::train_flops_per_sample(trainer.model(), a.batch);
    s["predicted_memory_bytes"] = r.predicted_memory_bytes;
    s["peak_memory_bytes"] = r.peak_memory_bytes;
    s["memory_plan"] = plan_json(plan);
    if (r.device == "cuda") {
      s["device_memory_used_bytes"] = r.device_memory_used_bytes;
      s["graph_replay"] = r.graph_replay;
      s["kernels_per_step"] = r.kernels_per_step;
      s["launches_per_step"] = r.launches_per_step;
      s["gpu_utilization_mean"] = r.gpu_utilization_mean;
      if (r.precision == "fp16") {
        s["skipped_steps"] = r.skipped_steps;
        s["loss_scale"] = r.loss_scale;
      }
    }
    s["train_seconds"] = r.train_seconds;
    s["wall_seconds"] = sat::now_seconds() - t0;
    write_json_atomic(a.out + "/summary.json", s);
    std::fprintf(stderr, "wrote %s/summary.json and %s/metrics.jsonl\n", a.out.c_str(), a.out.c_str());
  }
  return 0;
}

int run_info(const std::string& model, int64_t batch, const std::string& optimizer, double momentum, int64_t vocab,
             int ranks, int zero) {
  SAT_CHECK(ranks >= 1, "--ranks: expected a positive number of data-parallel ranks, got ", ranks);
  SAT_CHECK(zero == 0 || zero == 1, "--zero: expected 0 or 1 (ZeRO stage), got ", zero);
  TrainArgs a;
  a.model = model;
  a.vocab = vocab;
  sat::ModelConfig mc = model_for(a);
  sat::BuiltModel m = sat::build_model(mc, batch, true);
  sat::TrainConfig cfg;
  cfg.batch = batch;
  cfg.optim.name = optimizer;
  cfg.optim.momentum = float(momentum);
  cfg.zero = zero;
  int slots = sat::optimizer_slots(sat::resolve_optim(cfg.optim));
  // The plan of `saturate train` on data of the model's default shape (synthetic data
  // is generated on demand, so opening it costs nothing): loader rings included.
  sat::DataSplit data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  sat::MemoryPlan p = sat::Trainer::plan(mc, cfg, *data.train, data.test.get(), ranks);
  const auto& g = *m.graph;
  std::printf("model       %s\n", mc.name.c_str());
  std::printf("input       %s %s per micro-batch of %lld\n", m.x_shape.str().c_str(), sat::dtype_name(m.x_dtype), (long long)batch);
  std::printf("parameters  %lld (%zu tensors)\n", (long long)g.param_count(), g.params().size());
  std::printf("layers      %zu\n", g.nodes().size());
  std::printf("FLOPs       %.4g per sample forward, %.4g per sample training step (forward + backward)\n",
              g.flops_forward() / double(batch), sat::train_flops_per_sample(m, batch));
  std::printf("memory plan per rank (micro-batch %lld, optimizer %s%s%s):\n", (long long)batch, optimizer.c_str(),
              slots ? (" with " + std::to_string(slots) + " state slot(s)").c_str() : "",
              zero ? (", ZeRO-1 over " + std::to_string(ranks) + " rank(s)").c_str() : "");
  for (int k = 0; k < int(sat::MemKind::kCount); ++k)
    if (p.by_kind[size_t(k)])
      std::printf("  %-30s %12zu  %s\n", sat::mem_kind_name(sat::MemKind(k)), p.by_kind[size_t(k)],
                  sat::format_bytes(double(p.by_kind[size_t(k)])).c_str());
  std::printf("  %-30s %12zu  %s  (transient kinds above share it by lifetime)\n", "step arena", p.transient,
              sat::format_bytes(double(p.transient)).c_str());
  std::printf("  %-30s %12zu  %s\n", "total", p.total(), sat::format_bytes(double(p.total())).c_str());
  if (zero && slots) {
    sat::TrainConfig whole = cfg;
    whole.zero = 0;
    const sat::MemoryPlan w = sat::Trainer::plan(mc, whole, *data.train, data.test.get(), ranks);
    const size_t saved = w.total() - p.total();
    std::printf("ZeRO-1 saves %s per rank (optimizer state %s instead of %s; %.1f%% of the total)\n",
                sat::format_bytes(double(saved)).c_str(),
                sat::format_bytes(double(p.by_kind[size_t(sat::MemKind::optimizer_state)])).c_str(),
                sat::format_bytes(double(w.by_kind[size_t(sat::MemKind::optimizer_state)])).c_str(),
                100.0 * double(saved) / double(w.total()));
  } else if (zero) {
    std::printf("ZeRO-1 saves nothing here: %s keeps no optimizer state\n", optimizer.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argv);
  CLI::App app{"saturate: a training engine that keeps every accelerator busy"};
  app.set_version_flag("--version", "saturate 0.1");
  app.require_subcommand(1);
  // A repeated flag takes its last value, as argparse does.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  TrainArgs a;
  auto* train = app.add_subcommand("train", "train a model");
  train->add_option("--model", a.model, "mlp | convnet | resnet18 | gpt-mini | gpt2-124m")->capture_default_str();
  train->add_option("--data", a.data, "fashion-mnist | mnist:DIR | cifar10:DIR | tokens:FILE[:VAL] | synthetic[:CxHxW]")->capture_default_str();
  train->add_option("--batch", a.batch, "micro-batch size")->capture_default_str();
  train->add_option("--accum", a.accum, "micro-batches per optimizer step (gradient accumulation)")->capture_default_str();
  auto* epochs = train->add_option("--epochs", a.epochs, "epochs to train")->capture_default_str();
  auto* steps = train->add_option("--steps", a.steps, "optimizer steps to train (instead of --epochs)");
  epochs->excludes(steps);
  train->add_option("--lr", a.lr, "learning rate (default 0.01 for sgd, 0.001 for adamw)");
  train->add_option("--optimizer", a.optimizer, "sgd | adamw")->capture_default_str();
  train->add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  train->add_flag("--nesterov", a.nesterov, "Nesterov momentum (SGD)");
  train->add_option("--weight-decay", a.weight_decay, "weight decay (default: PyTorch's, 0 for sgd, 0.01 for adamw)");
  train->add_option("--schedule", a.schedule, "constant | step | cosine")->capture_default_str();
  train->add_option("--warmup", a.warmup, "linear learning-rate warm-up steps")->capture_default_str();
  train->add_option("--step-size", a.step_size, "step schedule: decay every N steps (default: a third of the run)");
  train->add_option("--gamma", a.gamma, "step schedule: decay factor")->capture_default_str();
  train->add_option("--seed", a.seed, "seed for initialisation, shuffling, dropout and synthetic data")->capture_default_str();
  train->add_option("--threads", a.threads, "CPU threads (0: all cores)")->capture_default_str();
  train->add_option("--shuffle", a.shuffle, "on | off (off: batches in file order)")->capture_default_str();
  train->add_option("--normalize", a.normalize, "MEAN,STD (or per-channel means then stds) applied after pixel/255");
  train->add_option("--eval", a.eval, "on | off: evaluate on the test split at the end")->capture_default_str();
  train->add_option("--vocab", a.vocab, "GPT models: vocabulary size (default: the model's)");
  train->add_option("--init-weights", a.init_weights, "start from these weights (safetensors)");
  train->add_option("--save-weights", a.save_weights, "save the trained weights (safetensors)");
  train->add_flag("--profile", a.profile, "time every layer (after warm-up) and print a table by layer kind");
  train->add_option("--out", a.out, "directory for summary.json and metrics.jsonl");
  train->add_option("--device", a.device, "auto | cpu | cuda | cuda:N (auto: cuda when a GPU is present)")->capture_default_str();
  train->add_option("--precision", a.precision, "fp32 | tf32 | bf16 | fp16 (GPU: mixed precision, fp32 master weights)")->capture_default_str();
  train->add_option("--cuda-graph", a.cuda_graph, "on | off: replay each step as one CUDA graph after warm-up")->capture_default_str();
  train->add_option("--last-batch", a.last_batch, "drop | pad: the last partial global batch of an epoch")->capture_default_str();
  train->add_option("--bucket-mb", a.bucket_mb, "data parallel: gradient bucket size in MiB")->capture_default_str();
  train->add_flag("--sync-bn", a.sync_bn, "data parallel: BatchNorm statistics over the global batch (default: per rank)");
  train->add_option("--zero", a.zero, "data parallel: 1 = shard optimizer state over the ranks (ZeRO-1), 0 = off")->capture_default_str();

  std::string imodel = "mlp", iopt = "sgd";
  int64_t ibatch = 64, ivocab = 0;
  double imom = 0;
  int iranks = 1, izero = 0;
  auto* info = app.add_subcommand("info", "parameters, FLOPs and the memory plan of a model");
  info->add_option("--model", imodel, "model")->capture_default_str();
  info->add_option("--batch", ibatch, "micro-batch size")->capture_default_str();
  info->add_option("--optimizer", iopt, "sgd | adamw (optimizer state in the plan)")->capture_default_str();
  info->add_option("--momentum", imom, "SGD momentum (0: no momentum buffer)")->capture_default_str();
  info->add_option("--vocab", ivocab, "GPT models: vocabulary size");
  info->add_option("--ranks", iranks, "data-parallel ranks (the plan is per rank)")->capture_default_str();
  info->add_option("--zero", izero, "1: optimizer state sharded over the ranks (ZeRO-1)")->capture_default_str();

  // `saturate launch -n N -- ARGS...` is parsed by hand: everything after -- belongs to
  // the launched command, which CLI11 would otherwise try to parse.
  if (argc >= 2 && std::string(argv[1]) == "launch") {
    try {
      int n = 0;
      int i = 2;
      std::vector<std::string> rest;
      for (; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--") { ++i; break; }
        if ((arg == "-n" || arg == "--np") && i + 1 < argc) {
          char* end = nullptr;
          long v = std::strtol(argv[++i], &end, 10);
          SAT_CHECK(end && *end == 0 && v >= 1, "-n: expected a positive number of processes, got '", argv[i], "'");
          n = int(v);
        } else if (arg == "-h" || arg == "--help") {
          std::printf("usage: saturate launch -n N -- train [options]\n"
                      "runs N processes of saturate under mpirun, with the flags users forget\n"
                      "(running as root, oversubscription on small machines), and prints the command\n");
          return 0;
        } else {
          sat::fail("saturate launch: unexpected argument '", arg, "'; usage: saturate launch -n N -- train ...");
        }
      }
      for (; i < argc; ++i) rest.push_back(argv[i]);
      SAT_CHECK(n >= 1, "saturate launch: -n N is required; usage: saturate launch -n N -- train ...");
      SAT_CHECK(!rest.empty(), "saturate launch: nothing to run; usage: saturate launch -n N -- train ...");
      sat::dist::exec_command(sat::dist::mpirun_command(n, rest, sat::dist::self_executable()));
    } catch (const sat::Error& e) {
      std::fprintf(stderr, "saturate: error: %s\n", e.what());
      return 2;
    }
  }

  sat::dist::BenchCommOptions bco;
  std::string bc_backend = "mpi";
  auto* bench = app.add_subcommand("bench", "benchmarks");
  auto* bcomm = bench->add_subcommand("comm", "all-reduce sweep over message sizes: algorithm and bus bandwidth");
  bench->require_subcommand(1);
  bcomm->add_option("--min-bytes", bco.min_bytes, "smallest message")->capture_default_str();
  bcomm->add_option("--max-bytes", bco.max_bytes, "largest message")->capture_default_str();
  bcomm->add_option("--iters", bco.iters, "timed all-reduces per size")->capture_default_str();
  bcomm->add_option("--warmup", bco.warmup, "untimed all-reduces per size")->capture_default_str();
  bcomm->add_option("--backend", bc_backend, "mpi (host memory)")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "saturate: error: %s\nrun 'saturate %s--help' for the options\n", e.what(),
                 train->parsed() ? "train " : info->parsed() ? "info " : bcomm->parsed() ? "bench comm " : "");
    return 2;
  }
  try {
    if (train->parsed()) return run_train(a);
    if (info->parsed()) return run_info(imodel, ibatch, iopt, imom, ivocab, iranks, izero);
    if (bcomm->parsed()) {
      SAT_CHECK(bc_backend == "mpi", "--backend: expected mpi (NCCL needs a GPU build and a GPU), got '", bc_backend, "'");
      SAT_CHECK(bco.min_bytes >= 4 && bco.min_bytes <= bco.max_bytes, "--min-bytes/--max-bytes: expected 4 <= min <= max");
      SAT_CHECK(bco.iters >= 1, "--iters: expected at least 1");
      auto comm = sat::dist::make_world_comm();
      auto rows = sat::dist::bench_comm(*comm, bco, std::cout);
      for (auto& r : rows)
        if (!r.ok) return 1;
      return 0;
    }
  } catch (const sat::Error& e) {
    const sat::dist::ProcessInfo pi = sat::dist::detect_process();
    if (pi.distributed()) {
      // The other ranks would wait for this one in their next collective: end the job.
      std::fprintf(stderr, "saturate: error on rank %d: %s\n", pi.rank, e.what());
      sat::dist::abort_job(2);
    }
    std::fprintf(stderr, "saturate: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "saturate: error: out of host memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "saturate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
