// The flags of `saturate`: one structure for the commands that share them (train, tune and
// info), each group of flags registered by one function, and the conversions from flags to
// the engine's typed configs (ModelConfig, Layout, TrainConfig, TunePolicy). Every number is
// range-checked where CLI11 parses it (check_numbers), so nothing below sees a typo's value.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cli/config_file.h"
#include "nn/models.h"
#include "train/config.h"
#include "tune/layout_tune.h"
#include "tune/policy.h"

namespace CLI {
class App;
}

namespace sat::cli {

constexpr int64_t kWarmupNotGiven = std::numeric_limits<int64_t>::min();

// The flags of train and tune (and info's subset of them). The defaults train well with
// nothing set (README "Defaults"): AdamW at 1e-3 with weight decay 0.01, warmed up over the
// first 5% of the steps, then a cosine decay to 0.
struct RunArgs {
  // Model and data.
  std::string model = "mlp", data = "fashion-mnist", shuffle = "on", normalize, eval = "on", last_batch = "drop";
  int64_t vocab = 0, seq_len = 0;  // --seq-len: GPT models' window (0: the context)
  uint64_t seed = 0;
  std::string label;        // tables (csv:): the class column
  std::string loader_workers = "auto";  // --loader-workers: a number, or auto (loader_workers_of)
  int prefetch = 2;                     // --prefetch: batches read ahead
  double val_fraction = 0;  // tables, image folders: the share of the rows (images) held out as the test split
  std::string augment = "off";  // image folders: off | standard | crop,flip
  bool skip_bad_images = false;  // image folders: leave out the files that cannot be read
  // Validation during training: every N steps (0: never) on K batches (0: all); the best's checkpoint.
  int64_t eval_every = 0, eval_batches = 0;
  std::string keep_best;
  // Layout: the micro-batch ("auto": tuned), tensor and pipeline parallelism (the
  // data-parallel degree is what is left), recomputation, ZeRO.
  std::string batch = "64", pp_schedule = "1f1b", pp_split, recompute = "none";
  int64_t accum = 1;
  int tp = 1, pp = 1, virtual_stages = 1, zero = 0;
  int ep = 1;  // expert parallelism (moe models): ranks of dp that split the experts
  int cp = 1;  // --cp: context-parallel ranks
  bool sequence_parallel = false;
  int ranks = 1;  // info: the data-parallel ranks planned for
  // Optimizer and schedule. NaN: not given (the optimizer's default applies).
  std::string optimizer = "adamw", schedule = "cosine";
  double lr = std::nan(""), momentum = 0, weight_decay = std::nan(""), gamma = 0.1;
  double eps = std::nan(""), clip_grad_norm = std::nan(""), min_lr = 0;
  std::string betas;  // B1,B2 ("": PyTorch's 0.9,0.999)
  bool nesterov = false;
  int64_t epochs = 1, steps = 0, warmup = kWarmupNotGiven, step_size = 0;
  // Device and data parallelism.
  std::string device = "auto", precision = "fp32", cuda_graph = "on", dist_backend = "auto";
  int threads = 0;
  double bucket_mb = 25;
  bool sync_bn = false;
  // Outputs, weights, checkpoints, profiling.
  std::string out, init_weights, save_weights, checkpoint_dir, resume, resume_change, trace, trace_steps;
  bool overwrite = false, profile = false, noise_scale = false;
  int64_t checkpoint_every = 0;
  double checkpoint_every_minutes = 0;
  int keep = 0;
  // Tuning (saturate tune, --batch auto, --layout).
  std::string memory_budget, objective = "throughput", layout;
  int64_t global_batch = 0, lr_batch = 64, min_steps_per_epoch = 50;
  double knee = 0.03;
  int layout_candidates = 3;
  std::vector<std::string> given;  // the layout flags given explicitly (they fix fields of --layout's search)
  // --config FILE.toml (cli/config_file.h), and every flag's value and where it came from,
  // once the command line and the file are read: what --out's config.toml records.
  std::string config;
  std::vector<FlagValue> flags;
};

// --model's help: the built-in models, the families and model files.
const char* model_help();

// One function per group of flags.
void add_model_options(CLI::App* c, RunArgs& a);
void add_data_options(CLI::App* c, RunArgs& a);
void add_loader_options(CLI::App* c, RunArgs& a);  // --loader-workers, --prefetch (in add_data_options)
void add_layout_options(CLI::App* c, RunArgs& a, bool info);
void add_optimizer_options(CLI::App* c, RunArgs& a);
void add_device_options(CLI::App* c, RunArgs& a);
void add_output_options(CLI::App* c, RunArgs& a);
void add_tuning_options(CLI::App* c, RunArgs& a);
// The commands' sets of them.
void add_train_options(CLI::App* c, RunArgs& a, bool tune);  // train's and tune's (tune: no --noise-scale)
void add_info_options(CLI::App* c, RunArgs& a);

// --config FILE: the file's values for the flags of `c` the command line left unset; then
// the layout flags given (note_layout_flags) and every flag's value (RunArgs::flags).
void read_config_and_flags(CLI::App* c, RunArgs& a);

// Every number of every option of app and its subcommands checked where CLI11 parses it:
// floats finite and within float's range, integers within their flag's range.
void check_numbers(CLI::App* app, const std::string& command);
// The layout flags given on the command line (with --layout they fix fields of the search).
void note_layout_flags(const CLI::App* c, RunArgs& a);

// --batch N (not "auto").
int64_t parse_batch(const std::string& v);

// --model with --vocab and --seq-len.
ModelConfig model_for(const RunArgs& a);
// --model, --vocab (0: the model's) and --seq-len (0: the context), as every command reads them.
ModelConfig model_for(const std::string& model, int64_t vocab, int64_t seq_len);
// The layout flags (batch: the micro-batch, "auto" resolved by the caller).
Layout layout_of(const RunArgs& a, int64_t batch);
// --loader-workers: its number, or for auto auto_loader_workers (data/loader.h) of this
// machine's cores shared by ranks_on_host ranks, each computing on cpu::num_threads() threads
// (a GPU run: the one thread that drives the device). sat::Error naming the flag.
int loader_workers_of(const RunArgs& a, bool gpu, int ranks_on_host);
// Every setting of train and tune but the layout's: optimizer, schedule, data order,
// device, outputs, checkpoints.
TrainConfig train_config(const RunArgs& a);
// --batch auto's settings and cache key parts.
TunePolicy tune_policy(const RunArgs& a, const std::string& data_description, bool tune_only);
// --layout auto|FIELDS and its options (the layout flags given fix fields of the search).
LayoutTuneConfig layout_tune_config(const RunArgs& a);

}  // namespace sat::cli
