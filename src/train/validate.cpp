#include "train/validate.h"

#include <cmath>

#include "backend/device.h"
#include "core/error.h"
#include "train/validation.h"

namespace sat {

DType activation_dtype(Precision p, Device dev) {
  if (p == Precision::fp16) require(dev, Feature::fp16, "--precision fp16");
  if (p == Precision::tf32) require(dev, Feature::tf32, "--precision tf32");
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
}

ModelConfig resolved_model(const ModelConfig& mc, const TrainConfig& cfg, int tp_rank, int* dev_index, int cp_rank,
                           int ep_rank) {
  ModelConfig m = mc;
  m.device = resolve_device(cfg.device, dev_index);
  m.act = activation_dtype(cfg.precision, m.device);
  m.tp = cfg.tp;
  m.tp_rank = tp_rank;
  m.sequence_parallel = cfg.sequence_parallel;
  m.cp = cfg.cp;
  m.cp_rank = cp_rank;
  m.recompute = cfg.recompute;
  m.ep = cfg.ep;
  m.ep_rank = ep_rank;
  return m;
}

void check_zero(const TrainConfig& cfg, bool cuda, int dp) {
  SAT_CHECK(cfg.zero >= 0 && cfg.zero <= 3, "--zero: expected a ZeRO stage 0, 1, 2 or 3, got ", cfg.zero);
  if (cfg.zero < 2) return;
  SAT_CHECK(dp > 1, "--zero ", cfg.zero, " shards the model over the data-parallel ranks, and this job has one (",
            cfg.tp * cfg.pp * dp, " rank(s), --tp ", cfg.tp, " --pp ", cfg.pp, "): run more ranks or leave --zero out");
  require(cuda ? Device::cuda : Device::cpu, Feature::zero23, str_cat("--zero ", cfg.zero));
  SAT_CHECK(!cfg.measure_noise, "--noise-scale with --zero ", cfg.zero, ": the noise scale needs each micro-batch's "
            "whole gradient, which ZeRO-2/3 never holds; measure it with --zero 0 or 1");
}

namespace {

// The settings' own ranges (the layout's: Layout::check).
void check_ranges(const TrainConfig& cfg) {
  SAT_CHECK(cfg.steps >= 0 && cfg.epochs >= 0, "--steps/--epochs: expected a non-negative number");
  // (at most 1 TiB: the size in floats is converted to an integer)
  SAT_CHECK(cfg.bucket_mb > 0 && cfg.bucket_mb <= 1 << 20, "--bucket-mb: expected a size from 0 to 1048576 (MiB), got ",
            cfg.bucket_mb);
  SAT_CHECK(!cfg.measure_noise || cfg.accum >= 2, "--noise-scale needs --accum 2 or more: the estimator compares one "
            "micro-batch's gradient with the whole step's (e.g. --batch ", std::max<int64_t>(1, cfg.batch / 2),
            " --accum 2 instead of --batch ", cfg.batch, ")");
  // --optimizer, --lr, --momentum, --weight-decay, --betas, --eps, --clip-grad-norm
  (void)resolve_optim(cfg.optim);
  (void)resolve_schedule(cfg.schedule, cfg.optim.lr);  // --schedule, --warmup, --step-size, --gamma, --min-lr
}

// What the device can run (backend/support.h), and where the gradients are reduced.
void check_device(const ModelConfig& mc, const TrainConfig& cfg, Device dev, int world) {
  (void)activation_dtype(cfg.precision, dev);
  if (cfg.dist_backend == DistBackend::nccl) require(dev, Feature::nccl);
  if (cfg.dist_backend == DistBackend::mpi && world > 1) require(dev, Feature::mpi_reduction);
  if (cfg.zero > 0 && world > 1) require(dev, cfg.zero == 1 ? Feature::zero1 : Feature::zero23, str_cat("--zero ", cfg.zero));
  if (cfg.recompute != Recompute::none)
    require(dev, Feature::recompute, str_cat("--recompute ", recompute_name(cfg.recompute)));
  if (cfg.sync_bn && world > 1) require(dev, Feature::sync_bn);
  if (cfg.profile) require(dev, Feature::profile);
  if (!cfg.trace_dir.empty()) require(dev, Feature::trace);
  if (cfg.measure_noise && cfg.tp > 1) require(dev, Feature::noise_scale_tp);
  if (!cfg.checkpoint_dir.empty() || !cfg.keep_best.empty()) require(dev, Feature::checkpoints);
  if (mc.experts > 0) require(dev, Feature::moe);
  SAT_CHECK(mc.experts == 0 || cfg.precision == Precision::fp32, "--precision ", precision_name(cfg.precision), ": ",
            mc.name, "'s mixture-of-experts layers run in float32 only for now (--precision fp32)");
  if (mc.family == ModelFamily::llama) require(dev, Feature::llama);
  if (cfg.ep > 1) require(dev, Feature::expert_parallel, str_cat("--ep ", cfg.ep));
  if (cfg.cp > 1) require(dev, Feature::context_parallel, str_cat("--cp ", cfg.cp));
  if (cfg.pp > 1 && splits_backward(cfg.pp_schedule))
    require(dev, Feature::zero_bubble, str_cat("--pp-schedule ", pipe_schedule_name(cfg.pp_schedule)));
}

// What context parallelism runs with yet: the CPU in float32, the gradients reduced over
// the data x context-parallel ranks without ZeRO, no noise probe.
void check_context_parallel_run(const TrainConfig& cfg, Device dev) {
  if (cfg.cp == 1) return;
  SAT_CHECK(dev == Device::cpu && cfg.precision == Precision::fp32, "--cp ", cfg.cp, ": context parallelism's ring "
            "attention runs on the CPU in float32 only yet (use --device cpu --precision fp32, or --cp 1)");
  SAT_CHECK(cfg.zero == 0, "--cp ", cfg.cp, " with --zero ", cfg.zero, ": ZeRO does not shard over the context-parallel "
            "ranks yet; leave --zero out");
  SAT_CHECK(!cfg.measure_noise, "--noise-scale with --cp ", cfg.cp, ": not measured under context parallelism yet");
}

}  // namespace

std::vector<std::string> refusals(const Layout& l, Device d, const ModelConfig* model) {
  struct Use {
    bool on;
    Feature f;
    std::string given = "";  // the flag as the layout gives it (default: the matrix's)
  };
  const std::vector<Use> used = {
      {model && model->experts > 0, Feature::moe},
      {model && model->family == ModelFamily::llama, Feature::llama},
      {l.zero == 1 && l.dp > 1, Feature::zero1},
      {l.zero >= 2, Feature::zero23},
      {l.recompute != Recompute::none, Feature::recompute},
      {l.tp > 1, Feature::tensor_parallel},
      {l.sequence_parallel, Feature::sequence_parallel},
      {l.pp > 1, Feature::pipeline},
      {l.pp > 1 && splits_backward(l.pp_schedule), Feature::zero_bubble,
       str_cat("--pp-schedule ", pipe_schedule_name(l.pp_schedule))},
      {l.cp > 1, Feature::context_parallel, str_cat("--cp ", l.cp)},
      {l.ep > 1, Feature::expert_parallel, str_cat("--ep ", l.ep)}};
  std::vector<std::string> out;
  for (const Use& u : used) {
    if (!u.on || support(d, u.f) != Support::not_built) continue;
    try {
      require(d, u.f, u.given);
    } catch (const Error& e) {
      out.push_back(e.what());
    }
  }
  return out;
}

void validate_run(const ModelConfig& mc, const TrainConfig& cfg, int world) {
  check_ranges(cfg);
  check_validation(mc, cfg);  // --eval-every, --eval-batches, --keep-best
  // The model's own limits first: no number of processes can fix them.
  check_tensor_parallel(mc, cfg.tp, cfg.sequence_parallel);
  check_expert_parallel(mc, cfg.ep);
  check_context_parallel(mc, cfg.cp, cfg.tp, cfg.sequence_parallel);
  ModelConfig rc = mc;
  rc.recompute = cfg.recompute;
  check_recompute(rc);
  const Device dev = resolve_device(cfg.device);
  check_device(mc, cfg, dev, world);
  cfg.check(world);  // the layout's ranges and its fit to the job's ranks
  check_zero(cfg, dev != Device::cpu, cfg.dp_of(world));
  SAT_CHECK(cfg.zero == 0 || cfg.ep == 1, "--zero ", cfg.zero, " with --ep ", cfg.ep, ": each rank holds its own "
            "experts' weights, which ZeRO's shards of the whole store do not follow yet; leave --zero out with --ep");
  SAT_CHECK(!cfg.measure_noise || cfg.ep == 1, "--noise-scale with --ep ", cfg.ep, ": a rank's gradient before the "
            "reduction holds its own experts' part of the group's tokens, not one micro-batch's gradient; measure it "
            "without --ep");
  check_context_parallel_run(cfg, dev);
  SAT_CHECK(!cfg.measure_noise || !cfg.sequence_parallel, "--noise-scale with --sequence-parallel: the LayerNorm "
            "gradients are partial sums before the reduction, so the first micro-batch's norm is not measured yet; "
            "measure it without --sequence-parallel");
}

}  // namespace sat
