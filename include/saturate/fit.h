// saturate as a C++ library: training, evaluation and prediction, Keras's
// model.fit(x, y, batch_size, epochs, validation_data, shuffle) in C++. Each call runs
// saturate's trainer (the one `saturate train` runs) in this process, or, launched under
// mpirun, data-parallel over every rank of the job (each rank calls fit alike).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "saturate/data.h"
#include "saturate/model.h"

namespace saturate {

// The defaults are saturate train's: AdamW at 1e-3 with weight decay 0.01, a linear
// warm-up over the first 5% of the steps, then a cosine decay to 0.
struct OptimizerOptions {
  std::string name = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double weight_decay = -1;    // < 0: PyTorch's default (adamw 0.01, sgd 0)
  double momentum = 0;         // sgd
  bool nesterov = false;       // sgd, with momentum > 0
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  // > 0: the gradients are scaled so that their total 2-norm over the whole model is at
  // most this (torch.nn.utils.clip_grad_norm_, saturate train --clip-grad-norm); 0: none.
  double clip_grad_norm = 0;
  std::string schedule = "cosine";  // cosine | constant
  double warmup_fraction = 0.05;    // of the steps
};

struct StepLog {
  int64_t step = 0, epoch = 0;  // 1-based
  double loss = 0, lr = 0, seconds = 0, samples_per_second = 0;
};

struct EpochLog {
  int64_t epoch = 0;
  double loss = 0;  // mean training loss over the epoch's steps
  double val_loss = NAN, val_accuracy = NAN;  // with validation (accuracy: classifiers)
  double seconds = 0;
};

struct FitOptions {
  int64_t batch_size = 64;  // per rank; 0: saturate's tuner chooses micro-batch and accumulation
  int64_t epochs = 1;
  int64_t steps = 0;        // optimizer steps instead of epochs (0: epochs)
  std::optional<Dataset> validation;  // evaluated after every epoch
  bool shuffle = true;
  OptimizerOptions optimizer;
  uint64_t seed = 0;        // initialisation (when the model has no weights), shuffling, dropout
  int threads = 0;          // 0: every core
  std::string precision = "fp32";  // or "bf16": activations in bf16, fp32 master weights (README "Mixed precision")
  bool progress = true;     // saturate train's progress on stderr
  std::string out_dir;      // metrics.jsonl there, a line per step, as saturate train --out writes it
  std::function<void(const StepLog&)> on_step;
  std::function<bool(const EpochLog&)> on_epoch;  // false stops training after that epoch
  // Asked after every step (under mpirun, rank 0's answer counts): true stops training at
  // that step, which then ends the last epoch (Python's saturate.fit stops on Ctrl-C so).
  std::function<bool()> stop_requested;
};

struct History {
  std::vector<double> loss;      // every step's
  std::vector<EpochLog> epochs;
  int64_t batch_size = 0, accumulation = 1, processes = 1, steps = 0;
  double samples_per_second = 0;  // after the warm-up steps
  double seconds = 0;
  uint64_t predicted_memory_bytes = 0, peak_memory_bytes = 0;  // saturate's plan, and what the step used
};

// Trains `model` on `train`, from its weights if it has any; afterwards it holds the
// trained weights. Each call starts a fresh optimizer and schedule.
History fit(Model& model, const Dataset& train, const FitOptions& options = {});

struct Evaluation {
  double loss = 0;
  double accuracy = NAN;  // classifiers
  int64_t samples = 0;
};
// The mean loss (and accuracy) over every sample of `data`, as saturate eval reports it.
Evaluation evaluate(const Model& model, const Dataset& data, int64_t batch_size = 64);

struct Predictions {
  int64_t rows = 0, width = 0;  // samples (token models: samples x T positions), classes
  std::vector<float> logits;    // rows x width
  std::vector<int64_t> labels() const;       // the most likely class of each row
  std::vector<float> probabilities() const;  // softmax of each row
};
// The model's outputs for every sample of `data` (labels not needed).
Predictions predict(const Model& model, const Dataset& data, int64_t batch_size = 64);

}  // namespace saturate
