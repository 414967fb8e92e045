// The `saturate` command: train, tune, eval, predict, info, plan, hardware, schedule, launch,
// bench, report, tokenize, generate, convert and import. It parses flags into typed configs (cli/args.h) and hands them to the
// command's run function; policy lives below it. User mistakes print one clear line and
// exit with status 2; nothing is written over until a run has succeeded.
#include <strings.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cli/args.h"
#include "cli/convert_cmd.h"
#include "cli/eval.h"
#include "cli/generate_cmd.h"
#include "cli/import_cmd.h"
#include "cli/info.h"
#include "cli/tokenize_cmd.h"
#include "cli/tools.h"
#include "cli/train.h"
#include "core/error.h"
#include "core/text.h"
#include "dist/comm.h"
#include "plan/hardware.h"
#include "plan/plan_cli.h"
#include "profile/run_report.h"
#include "train/schedule.h"

extern "C" char* openblas_get_corename(void);

namespace {

using sat::cli::RunArgs;

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

// Every command's flags, as CLI11 fills them, and the commands by name ("bench comm").
struct Commands {
  RunArgs train, tune, info, schedule;
  sat::EvalArgs eval, predict;
  sat::PlanArgs plan;
  sat::cli::HardwareArgs hardware;
  sat::cli::BenchCommArgs bench;
  sat::cli::TokenizeArgs tokenize;
  sat::cli::GenerateArgs generate;
  sat::cli::ConvertArgs convert;
  sat::cli::ImportArgs import_args;
  std::string report_dir;
  std::vector<std::pair<std::string, CLI::App*>> apps;
  CLI::App* app(const std::string& name) const {
    for (auto& [n, a] : apps)
      if (n == name) return a;
    return nullptr;
  }
  bool parsed(const std::string& name) const { return app(name)->parsed(); }
};

// eval and predict: the model, weights and data as train was given them.
void add_eval_options(CLI::App* c, sat::EvalArgs& a, bool predict) {
  c->add_option("--model", a.model, sat::cli::model_help())->capture_default_str();
  c->add_option("--init-weights", a.init_weights, "the trained weights: a safetensors file (train --save-weights) or a "
                "checkpoint directory")->required();
  c->add_option("--data", a.data, std::string(predict ? "the data whose test split is predicted (classifiers; " :
                "the data whose test split is evaluated (as given to train; ") + "csv:FILE, images:DIR: all of it)");
  c->add_option("--batch", a.batch, "micro-batch size (train's gives train's figures exactly)")->capture_default_str();
  c->add_option("--seed", a.seed, "train's --seed (synthetic data is generated from it)")->capture_default_str();
  c->add_option("--normalize", a.normalize, "train's --normalize");
  c->add_option("--label", a.label, "csv: train's --label (the weights' table description knows it)");
  c->add_option("--val-fraction", a.val_fraction, "csv:, images: train's --val-fraction (its test split; default all)");
  c->add_flag("--skip-bad-images", a.skip_bad_images, "images:DIR: leave out the files that are not whole images");
  c->add_option("--vocab", a.vocab, "GPT models: train's --vocab");
  c->add_option("--threads", a.threads, "CPU threads (0: the cores this rank may use: OMP_NUM_THREADS, its CPU binding, or the host's cores divided among its ranks)")->capture_default_str();
  if (!predict) {
    c->add_option("--seq-len", a.seq_len, "GPT models: evaluate on windows of T <= context tokens");
    c->add_option("--json", a.json, "write the test loss and accuracy to this JSON file");
    return;
  }
  c->add_option("--out", a.out, "the CSV written: index,class,probability,label (classifiers) or "
                "rank,token,probability,logit (GPT models with --prompt; --text: optional, with each token's text)");
  c->add_option("--prompt", a.prompt, "GPT models: a text file of token ids separated by whitespace");
  c->add_option("--text", a.text, "GPT and Llama models: the prompt as text, through the tokenizer; prints the most "
                "likely next tokens");
  c->add_option("--tokenizer", a.tokenizer, "with --text: a SentencePiece FILE.model (default: the tokenizer.model "
                "beside the shards the weights were trained on, which they record)");
  c->add_option("--top-k", a.top_k, "GPT models: how many of the most likely next tokens to write")->capture_default_str();
}

// The built-in GPU kinds for --gpu's help: "l4 | a10 | ... | mi300x".
std::string gpu_kinds() {
  std::string s;
  for (const std::string& k : sat::hardware_names()) s += (s.empty() ? "" : " | ") + k;
  return s;
}

void add_plan_options(CLI::App* c, sat::PlanArgs& a) {
  c->add_option("--model", a.model, sat::cli::model_help())->capture_default_str();
  c->add_option("--gpus", a.gpus, "devices")->capture_default_str();
  c->add_option("--gpu", a.gpu, gpu_kinds() + " | FILE.json | this (measured here)")->capture_default_str();
  c->add_option("--gpus-per-node", a.gpus_per_node, "devices per node (default: the hardware's)");
  c->add_option("--global-batch", a.global_batch, "samples per optimizer step");
  c->add_option("--calibrate", a.calibrate, "RUNS.json: fit the hardware's efficiency to measured runs (see the README)");
  c->add_option("--compare", a.compare, "RUNS.json: each run's published speed and peak memory against the prediction");
  c->add_option("--engine", a.engine, "saturate | megatron | deepspeed | fsdp: whose memory and communication to model "
                "(saturate: its exact plans; the others: their published formulas)")->capture_default_str();
  c->add_option("--precision", a.precision, "bf16 | fp16 | tf32 | fp32 (default bf16 on GPUs: mixed precision with "
                "fp32 master weights; fp32 for --gpu this)");
  c->add_option("--optimizer", a.optimizer, "adamw | sgd (its state in the memory plan)")->capture_default_str();
  c->add_option("--layout", a.layout, "fix fields: dp=D,tp=T,pp=P,micro=B,schedule=1f1b|interleaved|zb-h1,v=V,"
                "recompute=none|selective|full,sp=on|off,zero=0..3,cp=C,ep=E (the rest are searched)");
  c->add_option("--expert-imbalance", a.expert_imbalance, "moe under --ep: the busiest rank's experts' tokens over the "
                "mean (1: balanced)")->capture_default_str();
  c->add_option("--memory-budget", a.memory_budget, "bytes per device (8GiB, 512MiB, ...; default: the hardware's "
                "memory)");
  c->add_option("--memory-limit", a.memory_limit, "the old name of --memory-budget")->group("");  // hidden
  c->add_option("--top", a.top, "layouts to print")->capture_default_str();
  c->add_flag("--runnable-only", a.runnable_only, "search only the layouts saturate train runs on the device today "
              "(the others are marked ! in the table)");
  c->add_option("--out", a.out_dir, "directory for plan.json and plan.html");
  c->add_option("--json", a.json_file, "write the layouts as JSON to this file");
}

// hardware, schedule, bench comm and report.
void add_tool_commands(CLI::App& app, Commands& c) {
  auto* hw = app.add_subcommand("hardware", "what a GPU kind, a cluster (JSON file) or this machine (measured) can do, "
                                "as the layout planner sees it");
  hw->add_option("--gpu", c.hardware.gpu, gpu_kinds() + " | FILE.json | this (measure this machine; under mpirun, "
                 "with the links between the ranks)")->capture_default_str();
  hw->add_flag("--json", c.hardware.json, "print the description in the JSON file format (edit it and pass it back as "
               "--gpu FILE)");
  hw->add_option("--threads", c.hardware.threads, "with --gpu this: CPU threads per process, as saturate train's (0: "
                 "the cores it may use)")->capture_default_str();
  RunArgs& s = c.schedule;
  s.pp_schedule = "1f1b";
  auto* sched = app.add_subcommand("schedule", "print a pipeline schedule as a per-rank grid (time runs left to right)");
  sched->add_option("--pp", s.pp, "pipeline stages")->capture_default_str();
  sched->add_option("--accum", s.accum, "micro-batches per optimizer step")->capture_default_str();
  sched->add_option("--pp-schedule", s.pp_schedule, "none | gpipe | 1f1b | interleaved | zb-h1 | zb-v")->capture_default_str();
  sched->add_option("--virtual-stages", s.virtual_stages, "interleaved: model chunks per stage")->capture_default_str();
  auto* bench = app.add_subcommand("bench", "benchmarks");
  auto* bcomm = bench->add_subcommand("comm", "all-reduce and point-to-point sweeps over message sizes: bandwidth, and "
                                      "the latency and bandwidth fitted to them");
  bench->require_subcommand(1);
  sat::dist::BenchCommOptions& o = c.bench.options;
  bcomm->add_option("--min-bytes", o.min_bytes, "smallest message")->capture_default_str();
  bcomm->add_option("--max-bytes", o.max_bytes, "largest message")->capture_default_str();
  bcomm->add_option("--iters", o.iters, "timed all-reduces per size")->capture_default_str();
  bcomm->add_option("--warmup", o.warmup, "untimed all-reduces per size")->capture_default_str();
  bcomm->add_option("--backend", c.bench.backend, "mpi (host memory) | nccl (GPU memory, one GPU per rank)")
      ->capture_default_str();
  auto* report = app.add_subcommand("report", "report.html of a finished run: loss and throughput, where each rank's "
                                    "step time goes, and (with --trace) one step's timeline and memory");
  report->add_option("RUN_DIR", c.report_dir, "the run's --out directory")->required();
  for (auto [name, a] : {std::pair{"hardware", hw}, {"schedule", sched}, {"bench comm", bcomm}, {"report", report}})
    c.apps.emplace_back(name, a);
  c.apps.emplace_back("tokenize", sat::cli::add_tokenize_command(app, c.tokenize));
  c.apps.emplace_back("generate", sat::cli::add_generate_command(app, c.generate));
  c.apps.emplace_back("convert", sat::cli::add_convert_command(app, c.convert));
  c.apps.emplace_back("import", sat::cli::add_import_command(app, c.import_args));
}

void add_commands(CLI::App& app, Commands& c) {
  auto* train = app.add_subcommand("train", "train a model");
  sat::cli::add_train_options(train, c.train, false);
  auto* tune = app.add_subcommand("tune", "find the micro-batch, accumulation and learning rate for a memory budget "
                                  "(--layout auto: the whole layout of the ranks)");
  sat::cli::add_train_options(tune, c.tune, true);
  auto* eval = app.add_subcommand("eval", "test loss and accuracy of trained weights (train's final evaluation)");
  add_eval_options(eval, c.eval, false);
  auto* predict = app.add_subcommand("predict", "the model's outputs: each test sample's class and probability "
                                     "(CSV), or a language model's top-k next tokens after --prompt or --text");
  add_eval_options(predict, c.predict, true);
  auto* info = app.add_subcommand("info", "parameters, FLOPs and the memory plan of a model (every pipeline stage's)");
  sat::cli::add_info_options(info, c.info);
  auto* plan = app.add_subcommand("plan", "the fastest layout that fits: data/tensor/pipeline split, micro-batch, "
                                  "schedule, recomputation and ZeRO stage, from a cost model");
  add_plan_options(plan, c.plan);
  for (auto [name, a] : {std::pair{"train", train}, {"tune", tune}, {"eval", eval}, {"predict", predict}, {"info", info},
                         {"plan", plan}})
    c.apps.emplace_back(name, a);
  add_tool_commands(app, c);
}

// A parse error, with the command whose help lists the options. Under mpirun the other
// ranks (launched with other flags, MPMD) learn of it at the job's first collective.
int parse_error(const Commands& c, const CLI::ParseError& e) {
  const sat::dist::ProcessInfo pi = sat::dist::detect_process();
  const std::string who = pi.distributed() ? "error on rank " + std::to_string(pi.rank) : "error";
  std::string command;
  for (const char* name : {"train", "tune", "eval", "predict", "info", "hardware", "plan", "schedule", "bench comm",
                           "report", "tokenize", "generate", "convert", "import"})
    if (command.empty() && c.parsed(name)) command = std::string(name) + " ";
  std::fprintf(stderr, "saturate: %s: %s\nrun 'saturate %s--help' for the options\n", who.c_str(),
               sat::printable(e.what()).c_str(), command.c_str());
  if (pi.distributed()) sat::dist::end_job_after_input_error(2, e.what());  // the others stop with it
  return 2;
}

// `saturate trian`: the first word names no command (CLI11 would say a subcommand is
// required). Returns 2 after saying so, 0 when the word is a command or a flag.
int unknown_command(const CLI::App& app, const char* word) {
  if (!word || word[0] == '-') return 0;
  std::vector<std::string> names{"launch"};
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(s->get_name());
  std::string list, near;
  for (const std::string& n : names) {
    if (n == word) return 0;
    list += (list.empty() ? "" : ", ") + n;
    if (near.empty() && sat::edit_distance(word, n) <= 2) near = n;
  }
  std::fprintf(stderr, "saturate: error: unknown command '%s': expected one of %s%s\nrun 'saturate --help' for the "
               "commands\n", sat::printable(word).c_str(), list.c_str(),
               near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str());
  if (sat::dist::detect_process().distributed())  // the other ranks stop with it
    sat::dist::end_job_after_input_error(2, sat::str_cat("unknown command '", word, "'"));
  return 2;
}

int run_command(Commands& c) {
  if (c.parsed("train")) {
    const int status = sat::cli::run_train(c.train, false);  // its communicators are gone here
    // Stopped by a signal: every rank exits 128 + signal at the same step, as one job.
    if (status > 128) sat::dist::finish_job_together();
    return status;
  }
  if (c.parsed("tune")) return sat::cli::run_train(c.tune, true);
  if (c.parsed("eval")) return sat::run_eval(c.eval);
  if (c.parsed("predict")) return sat::run_predict(c.predict);
  if (c.parsed("info")) return sat::cli::run_info(c.info);
  if (c.parsed("hardware")) return sat::cli::run_hardware(c.hardware);
  if (c.parsed("plan")) return sat::run_plan(c.plan);
  if (c.parsed("report")) {
    std::printf("wrote %s\n", sat::write_run_report(c.report_dir).c_str());
    return 0;
  }
  if (c.parsed("schedule")) {
    std::printf("%s", sat::format_schedule(sat::cli::layout_of(c.schedule, 1).schedule_spec()).c_str());
    return 0;
  }
  if (c.parsed("bench comm")) return sat::cli::run_bench_comm(c.bench);
  if (c.parsed("tokenize")) return sat::cli::run_tokenize(c.tokenize);
  if (c.parsed("generate")) return sat::cli::run_generate(c.generate);
  if (c.parsed("convert")) return sat::cli::run_convert(c.convert);
  if (c.parsed("import")) return sat::cli::run_import(c.import_args);
  return 0;
}

// Runs fn, turning what it throws into the exit status and one line on stderr.
template <typename F>
int guarded(F&& fn) {
  try {
    return fn();
  } catch (const sat::ReportedError&) {
    // Every rank met it together and has printed its line: end as one job, each rank with
    // status 2 and MPI finalised (not an abort).
    sat::dist::finish_job_together();
    return 2;
  } catch (const sat::Error& e) {
    const sat::dist::ProcessInfo pi = sat::dist::detect_process();
    const std::string what = sat::cli::with_config_origin(e.what());  // a --config file's key: its file and line
    if (pi.distributed()) {
      // The other ranks would wait for this one in their next collective: end the job
      // (after every rank has said so, when all of them met the error before training).
      std::fprintf(stderr, "saturate: error on rank %d: %s\n", pi.rank, sat::printable(what).c_str());
      sat::dist::end_job_after_input_error(2, what);
    }
    std::fprintf(stderr, "saturate: error: %s\n", sat::printable(what).c_str());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "saturate: error: out of host memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "saturate: error: %s\n", sat::printable(e.what()).c_str());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argv);
  // A file size limit (ulimit -f) makes a write fail with EFBIG, reported as an error
  // naming the file, instead of killing the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  // `saturate launch -n N -- ARGS...` is parsed by hand: everything after -- belongs to the
  // launched command, which CLI11 would otherwise try to parse.
  if (argc >= 2 && std::string(argv[1]) == "launch") return guarded([&] { return sat::cli::run_launch(argc, argv); });
  CLI::App app{"saturate: a training engine that keeps every accelerator busy"};
  app.set_version_flag("--version", "saturate 0.1");
  app.require_subcommand(1);
  // A repeated flag takes its last value, as argparse does.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Commands c;
  add_commands(app, c);
  sat::cli::check_numbers(&app, "");
  if (argc >= 2 && unknown_command(app, argv[1])) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return parse_error(c, e);
  }
  return guarded([&] {
    for (auto [name, a] : {std::pair{"train", &c.train}, {"tune", &c.tune}})
      if (c.parsed(name)) sat::cli::read_config_and_flags(c.app(name), *a);
    return run_command(c);
  });
}
