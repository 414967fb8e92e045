#include "cli/args.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cstdlib>
#include <map>
#include <optional>

#include <thread>

#include "backend/cpu/blas.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/text.h"
#include "dist/comm.h"
#include "plan/planner.h"
#include "profile/trace.h"
#include "train/resume_policy.h"

namespace sat::cli {

namespace {

constexpr const char* kModelHelp =
    "mlp | convnet | resnet18 | gpt-mini | gpt2-124m, or a family: gpt:layers=L,heads=H,width=C,context=T,vocab=V"
    "[,dropout=P] | llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V[,norm_eps=E][,rope_theta=R] | "
    "mlp:IN-HIDDEN...-CLASSES | resnet:18|34, or a model file: file:NET.json (README 'Your own model')";

// An integer flag's range (check_numbers). A flag that is not listed gets [0, 2^31 - 1];
// "COMMAND FLAG" overrides FLAG for one command.
struct IntRange {
  long long lo, hi;
};

const std::map<std::string, IntRange>& int_ranges() {
  static const std::map<std::string, IntRange> r = {
      {"--accum", {1, 1 << 20}},         {"--epochs", {1, 1000000}},
      {"--steps", {1, 1LL << 40}},       {"--warmup", {0, 1LL << 40}},
      {"--step-size", {0, 1LL << 40}},   {"--vocab", {0, 1 << 30}},
      {"--seq-len", {1, 1 << 30}},       {"--top-k", {1, 1 << 30}},
      {"--threads", {0, 1024}},          {"--zero", {0, 3}},
      {"--prefetch", {0, 64}},
      {"--tp", {1, 4096}},               {"--pp", {1, 4096}},
      {"--ep", {1, 4096}},
      {"--cp", {1, 4096}},
      {"--virtual-stages", {1, 1024}},   {"--global-batch", {0, 1LL << 40}},
      {"--layout-candidates", {1, 64}},  {"--lr-batch", {1, 1LL << 40}},
      {"--min-steps-per-epoch", {0, 1LL << 40}},
      {"--eval-every", {1, 1LL << 40}},  {"--eval-batches", {1, 1LL << 40}},
      {"--batch", {1, kMaxMicroBatch}},  {"--ranks", {1, 1 << 20}},
      {"--gpus", {1, 1 << 20}},          {"--gpus-per-node", {0, 4096}},
      {"--top", {1, 100000}},            {"--min-bytes", {4, 1LL << 34}},
      {"--max-bytes", {4, 1LL << 34}},   {"--iters", {1, 1000000}},
      {"bench comm --warmup", {0, 1000000}},
      // saturate schedule prints a grid of every rank and micro-batch
      {"schedule --pp", {1, 256}},       {"schedule --accum", {1, 4096}},
      {"schedule --virtual-stages", {1, 64}},
      {"generate --top-k", {0, 1 << 30}},  {"generate --max-new-tokens", {0, 1 << 30}},
  };
  return r;
}

// An integer within `range` (unsigned_any: any 64-bit unsigned value, --seed's).
CLI::Validator integer_check(IntRange range, bool unsigned_any) {
  return CLI::Validator(
      [range, unsigned_any](std::string& v) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool neg = v.find('-') != std::string::npos;
        if (unsigned_any) {
          if (!neg) (void)std::strtoull(v.c_str(), &end, 0);
          if (!neg && end != v.c_str() && *end == 0 && errno == 0) return "";
          return "expected an integer from 0 to 18446744073709551615, got '" + v + "'";
        }
        const long long x = std::strtoll(v.c_str(), &end, 0);
        if (end == v.c_str() || *end != 0 || errno != 0 || x < range.lo || x > range.hi)
          return str_cat("expected an integer from ", range.lo, " to ", range.hi, ", got '", v, "'");
        return "";
      },
      "", "range");
}

// A number the engine can compute with: finite and within float's range (NaN, inf and
// 1e999 would otherwise pass every `x > 0` check and train on silently).
CLI::Validator finite_check() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != 0) return "expected a number, got '" + v + "'";
        if (!std::isfinite(x) || std::fabs(x) > double(FLT_MAX))
          return "expected a finite number (at most 3.4e38 in magnitude), got '" + v + "'";
        return "";
      },
      "", "finite");
}

// "2,5,7": --pp-split's cut points.
std::vector<int> parse_int_list(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  size_t pos = 0;
  while (!v.empty() && pos <= v.size()) {
    const size_t end = std::min(v.find(',', pos), v.size());
    const std::string item = v.substr(pos, end - pos);
    char* stop = nullptr;
    const long x = std::strtol(item.c_str(), &stop, 10);
    SAT_CHECK(!item.empty() && stop && *stop == 0 && x >= 0 && x < 1000000, flag,
              ": expected block indices separated by commas (such as 2,5), got '", v, "'");
    out.push_back(int(x));
    pos = end + 1;
  }
  return out;
}

// A layout flag given beside --layout fixes that field of the search; one that --layout
// fixes too must agree with it.
template <typename T>
void fix_field(std::optional<T>& field, bool given, T value, const std::string& flag, const std::string& shown) {
  if (!given) return;
  SAT_CHECK(!field || *field == value, flag, " disagrees with --layout's ", shown, " (give the field once)");
  field = value;
}

// --layout auto|FIELDS with the fields the layout flags fix.
LayoutFilter layout_filter(const RunArgs& a) {
  auto given = [&](const char* flag) { return std::count(a.given.begin(), a.given.end(), flag) > 0; };
  LayoutFilter f = a.layout == "auto" ? LayoutFilter{} : parse_layout(a.layout);
  for (const char* flag : {"--accum", "--pp-split", "--noise-scale"})
    SAT_CHECK(!given(flag), flag, ": not with --layout, which chooses the accumulation (--global-batch / (micro-batch x "
              "dp)) and the pipeline's cut; fix the micro-batch with --batch N or --layout micro=N");
  SAT_CHECK(!given("--cp"), "--cp: not with --layout yet (the planner does not search context parallelism); give "
            "the layout with --tp, --pp and --batch instead");
  fix_field(f.tp, given("--tp"), a.tp, "--tp " + std::to_string(a.tp), "tp=" + std::to_string(f.tp.value_or(0)));
  fix_field(f.pp, given("--pp"), a.pp, "--pp " + std::to_string(a.pp), "pp=" + std::to_string(f.pp.value_or(0)));
  fix_field(f.zero, given("--zero"), a.zero, "--zero " + std::to_string(a.zero), "zero=" + std::to_string(f.zero.value_or(0)));
  fix_field(f.v, given("--virtual-stages"), a.virtual_stages, "--virtual-stages " + std::to_string(a.virtual_stages),
            "v=" + std::to_string(f.v.value_or(0)));
  fix_field(f.sp, given("--sequence-parallel"), true, "--sequence-parallel", "sp=off");
  fix_field(f.recompute, given("--recompute"), parse_recompute(a.recompute), "--recompute " + a.recompute,
            std::string("recompute=") + recompute_name(f.recompute.value_or(Recompute::none)));
  fix_field(f.schedule, given("--pp-schedule"), parse_pipe_schedule(a.pp_schedule), "--pp-schedule " + a.pp_schedule,
            std::string("schedule=") + pipe_schedule_name(f.schedule.value_or(PipeSchedule::one_f_one_b)));
  if (given("--batch") && a.batch != "auto")
    fix_field(f.micro, true, parse_batch(a.batch), "--batch " + a.batch, "micro=" + std::to_string(f.micro.value_or(0)));
  return f;
}

}  // namespace

const char* model_help() { return kModelHelp; }

void add_model_options(CLI::App* c, RunArgs& a) {
  c->add_option("--model", a.model, kModelHelp)->capture_default_str();
  c->add_option("--vocab", a.vocab, "GPT models: vocabulary size (default: the model's)");
  c->add_option("--seq-len", a.seq_len, "GPT models: train on windows of T tokens, T <= the model's context "
                "(default: the context; the weights keep the context's shapes)");
}

void add_data_options(CLI::App* c, RunArgs& a) {
  c->add_option("--data", a.data, "fashion-mnist | mnist:DIR | cifar10:DIR | csv:FILE[:VAL] | images:DIR[:VALDIR] "
                "(DIR/CLASS/*.png|jpg) | tokens:FILE[:VAL] (FILE, VAL: a shard, a glob or a directory; without VAL, "
                "FILE's *_val_* shards) | synthetic[:CxHxW]")->capture_default_str();
  c->add_option("--label", a.label, "csv: the column of class labels (integers or strings; every other column is a "
                "numeric feature)");
  c->add_option("--val-fraction", a.val_fraction, "csv:FILE, images:DIR: hold out this share of the rows or images "
                "(after a seeded shuffle) as the test split");
  c->add_option("--augment", a.augment, "images:DIR: off | standard (= crop,flip) | crop,flip: random resized crops "
                "(scale 0.08-1, ratio 3/4-4/3) and horizontal flips of the training images, drawn from --seed, the "
                "epoch and the image")->capture_default_str();
  c->add_flag("--skip-bad-images", a.skip_bad_images, "images:DIR: leave out the files that are not whole PNG or JPEG "
              "images (default: the first one stops the run, naming it)");
  c->add_option("--seed", a.seed,
                "seed for initialisation, shuffling, dropout, synthetic data, --val-fraction's split and --augment")
      ->capture_default_str();
  c->add_option("--shuffle", a.shuffle, "on | off (off: batches in file order)")->capture_default_str();
  c->add_option("--normalize", a.normalize, "MEAN,STD (or per-channel means then stds) applied after pixel/255; csv: "
                "per-feature instead of the training rows' own");
  c->add_option("--eval", a.eval, "on | off: evaluate on the test split at the end")->capture_default_str();
  c->add_option("--eval-every", a.eval_every, "also evaluate on the test split every N optimizer steps (metrics.jsonl: "
                "val_loss, and val_accuracy or a language model's val_perplexity)");
  c->add_option("--eval-batches", a.eval_batches, "with --eval-every: those evaluations read the first K x --batch "
                "samples of the test split (default: all of it)");
  c->add_option("--keep-best", a.keep_best, "val_loss (lower is better) | val_accuracy (higher is better): with "
                "--eval-every and --out DIR, keep the best evaluation's checkpoint in DIR/best");
  c->add_option("--last-batch", a.last_batch, "drop | pad: the last partial global batch of an epoch")
      ->capture_default_str();
  add_loader_options(c, a);
}

void add_loader_options(CLI::App* c, RunArgs& a) {
  c->add_option("--loader-workers", a.loader_workers, "threads that read and augment batches ahead of the step, or "
                "auto: the cores the rank's compute leaves free, 1 to 8 (a CPU run using every core: 1); 0: the step "
                "reads its batches itself")->capture_default_str();
  c->add_option("--prefetch", a.prefetch, "batches read ahead of the step (the loader's ring; 0: the step reads its "
                "batches itself)")->capture_default_str();
}

void add_layout_options(CLI::App* c, RunArgs& a, bool info) {
  auto* batch = c->add_option("--batch", a.batch, info ? "micro-batch size" : "micro-batch size, or auto: tune it first "
                              "(cached)")->capture_default_str();
  if (info) batch->check(integer_check(int_ranges().at("--batch"), false));
  c->add_option("--accum", a.accum, "micro-batches per optimizer step (gradient accumulation; in flight in a pipeline)")
      ->capture_default_str();
  c->add_option("--tp", a.tp, "tensor-parallel ranks per layer (Megatron-LM's splits; mlp and gpt)")->capture_default_str();
  c->add_option("--cp", a.cp, "context-parallel ranks: each sequence split over a ring of this many ranks (gpt and "
                "llama; the context divisible by 2 x cp)")->capture_default_str();
  c->add_flag("--sequence-parallel", a.sequence_parallel, "with --tp: LayerNorm and dropout on 1/tp of the sequence "
              "(all-gather / reduce-scatter instead of all-reduce)");
  c->add_option("--pp", a.pp, "pipeline stages: the model is cut between blocks into this many stages")
      ->capture_default_str();
  c->add_option("--pp-schedule", a.pp_schedule, "none | gpipe | 1f1b | interleaved | zb-h1 | zb-v (two chunks per rank in a V; see saturate schedule)")
      ->capture_default_str();
  c->add_option("--virtual-stages", a.virtual_stages, "interleaved: model chunks per stage")->capture_default_str();
  c->add_option("--pp-split", a.pp_split, "cut points between stages, by block (e.g. 2 or 1,3); default: balanced by "
                "FLOPs and memory");
  c->add_option("--recompute", a.recompute, "none | selective | full: recompute activations in backward instead of "
                "keeping them (selective: attention's probabilities; full: each transformer layer / residual block)")
      ->capture_default_str();
  c->add_option("--ep", a.ep, "expert parallelism (moe models): groups of this many data-parallel ranks split the "
                "experts of every moe layer and exchange tokens all-to-all")->capture_default_str();
  c->add_option("--zero", a.zero, "data parallel: shard over the ranks 1 = optimizer state (ZeRO-1), 2 = + gradients, "
                "3 = + parameters (fully sharded), 0 = off")->capture_default_str();
  if (info) c->add_option("--ranks", a.ranks, "data-parallel ranks (the plan is per rank)")->capture_default_str();
}

void add_optimizer_options(CLI::App* c, RunArgs& a) {
  c->add_option("--optimizer", a.optimizer, "adamw | sgd (its state in the memory plan)")->capture_default_str();
  c->add_option("--momentum", a.momentum, "SGD momentum (0: no momentum buffer)")->capture_default_str();
}

// The learning rate, its schedule and the run's length.
void add_schedule_options(CLI::App* c, RunArgs& a) {
  auto* epochs = c->add_option("--epochs", a.epochs, "epochs to train")->capture_default_str();
  auto* steps = c->add_option("--steps", a.steps, "optimizer steps to train (instead of --epochs)");
  epochs->excludes(steps);
  c->add_option("--lr", a.lr, "learning rate (default 0.01 for sgd, 0.001 for adamw)");
  c->add_flag("--nesterov", a.nesterov, "Nesterov momentum (SGD)");
  c->add_option("--weight-decay", a.weight_decay, "weight decay (default: PyTorch's, 0 for sgd, 0.01 for adamw)");
  c->add_option("--betas", a.betas, "AdamW: B1,B2, the decay rates of the moment estimates (default 0.9,0.999)");
  c->add_option("--eps", a.eps, "AdamW: the term added to the denominator (default 1e-8)");
  c->add_option("--clip-grad-norm", a.clip_grad_norm, "scale the gradients so that their total 2-norm over the whole "
                "model is at most X (torch.nn.utils.clip_grad_norm_; default: no clipping)");
  c->add_option("--schedule", a.schedule, "constant | step | cosine")->capture_default_str();
  c->add_option("--warmup", a.warmup, "linear learning-rate warm-up steps (default: 5% of the run's steps)");
  c->add_option("--step-size", a.step_size, "step schedule: decay every N steps (default: a third of the run)");
  c->add_option("--gamma", a.gamma, "step schedule: decay factor")->capture_default_str();
  c->add_option("--min-lr", a.min_lr, "cosine: the learning rate at the last step; step: the floor of the decay "
                "(PyTorch's eta_min)")->capture_default_str();
}

void add_device_options(CLI::App* c, RunArgs& a) {
  c->add_option("--device", a.device, "auto | cpu | cuda | cuda:N (auto: cuda when a GPU is present)")->capture_default_str();
  c->add_option("--precision", a.precision, "fp32 | tf32 | bf16 | fp16 (mixed precision with fp32 master weights; the "
                "CPU: fp32 or bf16)")->capture_default_str();
  c->add_option("--threads", a.threads, "CPU threads (0: the cores this rank may use: OMP_NUM_THREADS, its CPU binding, or the host's cores divided among its ranks)")->capture_default_str();
  c->add_option("--cuda-graph", a.cuda_graph, "on | off: replay each step as one CUDA graph after warm-up")
      ->capture_default_str();
  c->add_option("--bucket-mb", a.bucket_mb, "data parallel: gradient bucket size in MiB")->capture_default_str();
  c->add_option("--dist-backend", a.dist_backend, "data parallel: auto | mpi | nccl (auto: mpi on the CPU, nccl on "
                "GPUs; nccl with one rank runs the NCCL path alone)")->capture_default_str();
  c->add_flag("--sync-bn", a.sync_bn, "data parallel: BatchNorm statistics over the global batch (default: per rank)");
}

void add_output_options(CLI::App* c, RunArgs& a) {
  c->add_option("--init-weights", a.init_weights, "start from these weights (safetensors)");
  c->add_option("--save-weights", a.save_weights, "save the trained weights (safetensors)");
  c->add_option("--checkpoint-dir", a.checkpoint_dir, "write checkpoints (parameters, optimizer, data position) here");
  c->add_option("--checkpoint-every", a.checkpoint_every, "a checkpoint every N steps (and at the end)");
  c->add_option("--checkpoint-every-minutes", a.checkpoint_every_minutes, "a checkpoint every X minutes");
  c->add_option("--keep", a.keep, "keep the newest K checkpoints (0: all)");
  c->add_option("--resume", a.resume, "DIR (a checkpoint, or the newest under it) or auto (the newest in "
                "--checkpoint-dir, or a fresh start); the run may be longer and of another layout, other settings "
                "are refused unless --resume-change names them");
  c->add_option("--resume-change", a.resume_change, "with --resume: the settings this run may change from the "
                "checkpoint's, separated by commas: lr, momentum, nesterov, weight_decay, betas, clip_grad_norm, schedule, "
                "warmup, step_size, gamma, min_lr, seed, shuffle, data, normalize, last_batch, sync_bn, precision, "
                "model (each change "
                "is recorded in metrics.jsonl and summary.json)");
  c->add_flag("--profile", a.profile, "time every layer (after warm-up): a table per layer, and where each rank's "
              "step time goes");
  c->add_option("--trace", a.trace, "write Chrome/TensorBoard trace files of the steps --trace-steps records here "
                "(one per rank and window; with --out, report.html too)");
  c->add_option("--trace-steps", a.trace_steps, "which steps --trace records, as torch.profiler.schedule: "
                "wait=W,warmup=U,active=A,repeat=R (default 1,1,3,1)");
  c->add_option("--out", a.out, "directory for summary.json, metrics.jsonl and config.toml (the run's flags, for "
                "--config)");
  c->add_flag("--overwrite", a.overwrite, "with --out: replace the results of an earlier run in that directory");
}

void add_tuning_options(CLI::App* c, RunArgs& a) {
  c->add_option("--memory-budget", a.memory_budget, "bytes per rank (8GiB, 512MiB, ...): an allocation beyond it is an "
                "error; the tuner fits in it");
  c->add_option("--global-batch", a.global_batch, "with --batch auto: keep this global batch (micro-batch x accum x "
                "ranks); with --layout: the samples per optimizer step every layout shares");
  c->add_option("--layout", a.layout, "auto, or fields to fix as in saturate plan --layout (tp=2,zero=1,...): the "
                "planner ranks the layouts of these ranks on this machine, the best few are timed and the fastest is "
                "used; --tp, --pp, --zero, --recompute, --sequence-parallel, --pp-schedule, --virtual-stages and "
                "--batch N fix their fields too (needs --global-batch)");
  c->add_option("--layout-candidates", a.layout_candidates, "with --layout: the layouts timed, the planner's best first")
      ->capture_default_str();
  c->add_option("--objective", a.objective, "with --batch auto: throughput | goodput (throughput x statistical "
                "efficiency)")->capture_default_str();
  c->add_option("--knee", a.knee, "with --batch auto: the smallest micro-batch within this fraction of the best "
                "throughput")->capture_default_str();
  c->add_option("--lr-batch", a.lr_batch, "the global batch --lr is meant for; --batch auto scales it (linear SGD, "
                "sqrt AdamW)")->capture_default_str();
  c->add_option("--min-steps-per-epoch", a.min_steps_per_epoch, "with --batch auto and no --global-batch: the largest "
                "global batch leaves at least this many optimizer steps per epoch (0: no such cap)")->capture_default_str();
}

void add_train_options(CLI::App* c, RunArgs& a, bool tune) {
  c->add_option("--config", a.config, "FILE.toml: flags read from a TOML file (keys: the flags' names, batch = 32, "
                "lr = 3e-4, sync-bn = true); flags given here override it; a run's --out has its config.toml");
  add_model_options(c, a);
  add_data_options(c, a);
  add_layout_options(c, a, false);
  add_optimizer_options(c, a);
  add_schedule_options(c, a);
  add_device_options(c, a);
  add_output_options(c, a);
  add_tuning_options(c, a);
  if (tune) return;
  c->add_flag("--noise-scale", a.noise_scale, "measure the gradient noise scale every step (needs --accum 2 or more; "
              "with --batch auto it halves the micro-batch): metrics.jsonl and summary.json");
}

void add_info_options(CLI::App* c, RunArgs& a) {
  add_model_options(c, a);
  add_layout_options(c, a, true);
  add_optimizer_options(c, a);
  c->add_option("--precision", a.precision, "fp32 | bf16 (activations in bf16, fp32 master weights)")
      ->capture_default_str();
  c->add_option("--device", a.device, "cpu | cuda (cuda: what runs on GPUs too, the support matrix; the plan is the "
                "same)");
  add_loader_options(c, a);
}

void check_numbers(CLI::App* app, const std::string& command) {
  for (CLI::Option* o : app->get_options()) {
    const std::string type = o->get_type_name(), flag = o->get_name();
    if (type == "FLOAT") {
      o->check(finite_check());
    } else if (type == "INT" || type == "UINT") {
      auto it = int_ranges().find(command + " " + flag);
      if (it == int_ranges().end()) it = int_ranges().find(flag);
      const bool unsigned_any = type == "UINT" && it == int_ranges().end();  // --seed: any 64-bit value
      o->check(integer_check(it != int_ranges().end() ? it->second : IntRange{0, (1LL << 31) - 1}, unsigned_any));
    }
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; }))
    check_numbers(sub, command.empty() ? sub->get_name() : command + " " + sub->get_name());
}

void read_config_and_flags(CLI::App* c, RunArgs& a) {
  if (!a.config.empty()) apply_config_file(c, a.config);
  note_layout_flags(c, a);
  a.flags = flag_values(c);
}

void note_layout_flags(const CLI::App* c, RunArgs& a) {
  for (const char* f : {"--tp", "--cp", "--pp", "--zero", "--recompute", "--sequence-parallel", "--pp-schedule",
                        "--virtual-stages", "--pp-split", "--batch", "--accum", "--noise-scale"})
    if (c->get_option_no_throw(f) && c->count(f)) a.given.push_back(f);
}

int64_t parse_batch(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long b = std::strtoll(v.c_str(), &end, 10);
  SAT_CHECK(!v.empty() && end && *end == 0 && errno == 0 && b >= 1 && b <= kMaxMicroBatch,
            "--batch: expected a micro-batch size from 1 to ", kMaxMicroBatch, " or 'auto', got '", v, "'");
  return b;
}

ModelConfig model_for(const std::string& model, int64_t vocab, int64_t seq_len) {
  ModelConfig mc = model_config(model);
  if (vocab > 0) {
    SAT_CHECK(mc.tokens, "--vocab applies to the GPT and Llama models only, not --model ", model);
    mc.vocab = mc.classes = vocab;
  }
  set_seq_len(mc, seq_len);
  return mc;
}

ModelConfig model_for(const RunArgs& a) { return model_for(a.model, a.vocab, a.seq_len); }

Layout layout_of(const RunArgs& a, int64_t batch) {
  Layout l;
  l.batch = batch;
  l.accum = a.accum;
  l.tp = a.tp;
  l.cp = a.cp;
  l.sequence_parallel = a.sequence_parallel;
  l.pp = a.pp;
  l.pp_schedule = parse_pipe_schedule(a.pp_schedule);
  l.virtual_stages = a.virtual_stages;
  // zb-v runs two chunks per rank (a V): its default is that, not the flag's 1.
  if (l.pp_schedule == PipeSchedule::zb_v && l.virtual_stages == 1) l.virtual_stages = 2;
  l.pp_split = parse_int_list("--pp-split", a.pp_split);
  l.recompute = parse_recompute(a.recompute);
  l.zero = a.zero;
  l.ep = a.ep;
  return l;
}

namespace {
// --betas B1,B2 and --eps (AdamW's; PyTorch's defaults when not given).
void adam_into(const RunArgs& a, OptimConfig& o) {
  const bool given = !a.betas.empty() || !std::isnan(a.eps);
  SAT_CHECK(!given || a.optimizer == "adamw", !a.betas.empty() ? "--betas" : "--eps", " applies to --optimizer adamw, "
            "not ", a.optimizer);
  if (!a.betas.empty()) {
    const std::string bad = str_cat("--betas: expected two numbers in [0, 1) separated by a comma (such as 0.9,0.95), "
                                    "got '", a.betas, "'");
    const size_t comma = a.betas.find(',');
    SAT_CHECK(comma != std::string::npos, bad);
    double b[2];
    const std::string parts[2] = {a.betas.substr(0, comma), a.betas.substr(comma + 1)};
    for (int k = 0; k < 2; ++k) {
      char* end = nullptr;
      b[k] = std::strtod(parts[k].c_str(), &end);
      SAT_CHECK(!parts[k].empty() && end && *end == 0 && b[k] >= 0 && b[k] < 1, bad);
    }
    o.beta1 = float(b[0]), o.beta2 = float(b[1]);
  }
  SAT_CHECK(std::isnan(a.eps) || a.eps >= 0, "--eps: expected a number >= 0, got ", a.eps);
  if (!std::isnan(a.eps)) o.eps = float(a.eps);
}

void optimizer_into(const RunArgs& a, TrainConfig& cfg) {
  cfg.optim.name = a.optimizer;
  cfg.optim.lr = float(std::isnan(a.lr) ? (a.optimizer == "adamw" ? 1e-3 : 0.01) : a.lr);
  cfg.optim.momentum = float(a.momentum);
  cfg.optim.nesterov = a.nesterov;
  SAT_CHECK(std::isnan(a.weight_decay) || a.weight_decay >= 0, "--weight-decay: expected a number >= 0, got ",
            a.weight_decay);
  cfg.optim.weight_decay = std::isnan(a.weight_decay) ? -1.0f : float(a.weight_decay);  // < 0: PyTorch's default
  adam_into(a, cfg.optim);
  SAT_CHECK(std::isnan(a.clip_grad_norm) || float(a.clip_grad_norm) > 0, "--clip-grad-norm: expected a norm > 0, got ",
            a.clip_grad_norm, " (leave the flag out to train without clipping)");
  cfg.optim.clip_grad_norm = std::isnan(a.clip_grad_norm) ? 0.0f : float(a.clip_grad_norm);
  cfg.schedule.name = a.schedule;
  cfg.schedule.min_lr = float(a.min_lr);
  const bool auto_warmup = a.warmup == kWarmupNotGiven;
  SAT_CHECK(auto_warmup || a.warmup >= 0, "--warmup: expected a number of steps >= 0, got ", a.warmup);
  constexpr double kDefaultWarmupFraction = 0.05;  // --warmup not given: this share of the steps
  cfg.schedule.warmup = auto_warmup ? 0 : a.warmup;
  cfg.schedule.warmup_fraction = auto_warmup ? kDefaultWarmupFraction : 0;
  cfg.schedule.step_size = a.step_size;
  cfg.schedule.gamma = float(a.gamma);
  (void)resolve_schedule(cfg.schedule, cfg.optim.lr);  // --min-lr against --lr, before anything runs
}
}  // namespace

int loader_workers_of(const RunArgs& a, bool gpu, int ranks_on_host) {
  if (a.loader_workers == "auto")
    return auto_loader_workers(int(std::thread::hardware_concurrency()), ranks_on_host, gpu ? 1 : cpu::num_threads());
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(a.loader_workers.c_str(), &end, 10);
  SAT_CHECK(!a.loader_workers.empty() && *end == 0 && errno == 0 && v >= 0 && v <= kMaxLoaderWorkers,
            "--loader-workers: expected auto or a number of threads from 0 to ", kMaxLoaderWorkers, ", got '",
            a.loader_workers, "'");
  return int(v);
}

TrainConfig train_config(const RunArgs& a) {
  TrainConfig cfg;
  cfg.prefetch = a.prefetch;
  cfg.loader_workers =
      loader_workers_of(a, resolve_device(a.device) == Device::cuda, dist::detect_process().local_world);
  cfg.epochs = a.epochs;
  cfg.steps = a.steps;
  optimizer_into(a, cfg);
  cfg.seed = a.seed;
  cfg.shuffle = parse_on_off("--shuffle", a.shuffle);
  cfg.evaluate = parse_on_off("--eval", a.eval);
  cfg.out_dir = a.out;
  cfg.profile = a.profile;
  cfg.trace_dir = a.trace;
  if (!a.trace_steps.empty()) {
    SAT_CHECK(!a.trace.empty(), "--trace-steps needs --trace DIR (where the traces go)");
    cfg.trace_steps = parse_trace_schedule(a.trace_steps);
  }
  cfg.device = a.device;
  cfg.precision = parse_precision(a.precision);
  cfg.cuda_graph = parse_on_off("--cuda-graph", a.cuda_graph);
  static constexpr Named<LastBatch> kLastBatch[] = {{"drop", LastBatch::drop}, {"pad", LastBatch::pad}};
  cfg.last_batch = parse_named("--last-batch", a.last_batch, kLastBatch);
  cfg.bucket_mb = a.bucket_mb;
  cfg.dist_backend = parse_dist_backend(a.dist_backend);
  cfg.sync_bn = a.sync_bn;
  cfg.checkpoint_dir = a.checkpoint_dir;
  cfg.checkpoint_every = a.checkpoint_every;
  cfg.checkpoint_every_minutes = a.checkpoint_every_minutes;
  cfg.checkpoint_keep = a.keep;
  cfg.eval_every = a.eval_every;
  cfg.eval_batches = a.eval_batches;
  cfg.keep_best = a.keep_best;
  if (!a.keep_best.empty() && !a.out.empty()) cfg.best_dir = a.out + "/best";
  if (!a.resume_change.empty()) {
    SAT_CHECK(!a.resume.empty(), "--resume-change needs --resume (it names what the resumed run may change)");
    for (const std::string& s : parse_resume_change(a.resume_change)) cfg.resume_change.push_back(s);
  }
  return cfg;
}

TunePolicy tune_policy(const RunArgs& a, const std::string& data_description, bool tune_only) {
  TunePolicy p;
  if (!a.memory_budget.empty()) p.tune.memory_budget = parse_size("--memory-budget", a.memory_budget, kMinMemoryBytes);
  p.tune.global_batch = a.global_batch;
  p.tune.objective = a.objective;
  p.tune.knee = a.knee;
  p.tune.lr_batch = a.lr_batch;
  p.tune.min_steps_per_epoch = a.min_steps_per_epoch;
  p.budget_text = a.memory_budget;
  p.data = data_description;
  p.seq_len = a.seq_len;
  p.noise_scale = a.noise_scale;
  p.tune_only = tune_only;
  p.out_dir = a.out;
  return p;
}

LayoutTuneConfig layout_tune_config(const RunArgs& a) {
  LayoutTuneConfig t;
  t.filter = layout_filter(a);
  SAT_CHECK(a.global_batch >= 1, "--layout auto needs --global-batch (the samples per optimizer step the layouts share)");
  t.candidates = a.layout_candidates;
  t.global_batch = a.global_batch;
  if (!a.memory_budget.empty()) t.memory_budget = parse_size("--memory-budget", a.memory_budget, kMinMemoryBytes);
  return t;
}

}  // namespace sat::cli
