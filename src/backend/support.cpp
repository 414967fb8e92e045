#include "backend/support.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace sat {

namespace {
constexpr Support M = Support::measured, C = Support::compiled, N = Support::not_built, A = Support::not_applicable;
}  // namespace

const std::vector<SupportRow>& support_matrix() {
  static const std::vector<SupportRow> rows = {
      {Feature::fp32, "training in fp32", "--precision fp32", M, M, ""},
      {Feature::bf16, "bf16 mixed precision", "--precision bf16", M, M, ""},
      {Feature::fp16, "fp16 with loss scaling", "--precision fp16", N, M, "the CPU engine's precisions are fp32 and bf16"},
      {Feature::tf32, "tf32 GEMMs", "--precision tf32", N, C, "the CPU engine's precisions are fp32 and bf16"},
      {Feature::cuda_graphs, "whole-step CUDA graph replay", "--cuda-graph on", A, M, ""},
      {Feature::data_parallel, "data parallelism (MPI on CPUs, NCCL on GPUs)", "mpirun -np N", M, C, ""},
      {Feature::nccl, "NCCL gradient reduction", "--dist-backend nccl", N, C,
       "NCCL reduces GPU memory; the CPU engine reduces over mpi"},
      {Feature::mpi_reduction, "MPI gradient reduction over several ranks", "--dist-backend mpi", M, N,
       "MPI reduces host memory; GPU training reduces its gradients over nccl: --dist-backend auto or nccl"},
      {Feature::zero1, "ZeRO-1 over several ranks", "--zero 1", M, C, ""},
      {Feature::zero23, "ZeRO-2/3", "--zero 2|3", M, C, ""},
      {Feature::tensor_parallel, "tensor parallelism", "--tp", M, C, ""},
      {Feature::sequence_parallel, "sequence parallelism", "--sequence-parallel", M, C, ""},
      {Feature::pipeline, "pipeline parallelism (gpipe, 1f1b, interleaved)", "--pp", M, C, ""},
      {Feature::zero_bubble, "zero-bubble pipeline schedules (backward split into input and weight parts)",
       "--pp-schedule zb-h1|zb-v", M, N, "the split backward runs on the CPU only for now"},
      {Feature::context_parallel, "context parallelism (ring attention)", "--cp", M, N,
       "the ring attention runs on the CPU in float32 only for now"},
      {Feature::moe, "mixture-of-experts models (top-k router, capacity, load-balancing loss)", "--model moe:...", M, N,
       "the router and the experts have no GPU kernels yet"},
      {Feature::expert_parallel, "expert parallelism (all-to-all dispatch and combine)", "--ep", M, N,
       "mixture-of-experts layers run on the CPU only for now"},
      {Feature::recompute, "activation recomputation", "--recompute", M, N,
       "the GPU engine does not recompute activations yet"},
      {Feature::sync_bn, "synchronised BatchNorm over several ranks", "--sync-bn", M, N,
       "synchronised BatchNorm on GPUs is not built yet"},
      {Feature::batch_tuner, "batch-size tuner", "--batch auto", M, M, ""},
      {Feature::layout_tuner, "layout tuner", "--layout auto", M, N, "it plans and measures the CPU engine only"},
      {Feature::noise_scale, "gradient noise scale", "--noise-scale", M, M, ""},
      {Feature::noise_scale_tp, "gradient noise scale with tensor parallelism", "--noise-scale with --tp", M, N,
       "the GPU norms do not yet count a parameter whole on every tensor-parallel rank once"},
      {Feature::profile, "per-layer profile", "--profile", M, N,
       "the GPU engine's layers run asynchronously: timing them needs CUDA events, not built yet"},
      {Feature::trace, "step traces", "--trace", M, N,
       "the GPU engine's layers run asynchronously: timing them needs CUDA events, not built yet"},
      {Feature::checkpoints, "checkpoints and resuming", "--checkpoint-dir/--resume", M, N,
       "checkpoints are written and read on the CPU only for now"},
      {Feature::init_weights, "starting from weights", "--init-weights", M, N, "load on the CPU"},
      {Feature::eval_predict, "saturate eval and predict", "saturate eval/predict", M, N, "they run on the CPU"},
      {Feature::llama, "Llama models (RMSNorm, rotary, SwiGLU, grouped-query attention)", "--model llama:...", M, N,
       "RMSNorm, rotary embeddings, SwiGLU and grouped-query attention have no GPU kernels yet"},
      {Feature::library, "the C++ library (fit, evaluate, predict)", "sat::fit", M, N, "the library trains on the CPU"},
  };
  return rows;
}

namespace {
const SupportRow& row(Feature f) {
  const auto& rows = support_matrix();
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const SupportRow& r) { return r.feature == f; });
  SAT_ASSERT(it != rows.end());
  return *it;
}
}  // namespace

Support support(Device d, Feature f) { return d == Device::cuda ? row(f).cuda : row(f).cpu; }

void require(Device d, Feature f, const std::string& given) {
  if (support(d, f) != Support::not_built) return;
  const SupportRow& r = row(f);
  const std::string flag = given.empty() ? r.flag : given;
  if (d == Device::cuda) fail(flag, " needs --device cpu for now (", r.why, ")");
  fail(flag, " needs --device cuda (", r.why, ")");
}

const char* device_kind_name(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

const char* support_name(Support s) {
  switch (s) {
    case Support::measured: return "measured";
    case Support::compiled: return "compiled, not yet run";
    case Support::not_built: return "not built";
    default: return "-";
  }
}

std::string support_table() {
  std::string t = str_cat("what runs where (measured: built, run and tested: on CPU ranks, and on one NVIDIA H200 "
                          "with scripts/gpu-check; compiled, not yet run: built, its tests skip without a GPU)\n");
  char line[256];
  std::snprintf(line, sizeof line, "  %-38s %-24s %s\n", "", "CPU", "CUDA");
  t += line;
  for (const SupportRow& r : support_matrix()) {
    std::snprintf(line, sizeof line, "  %-38s %-24s %s\n", r.name, support_name(r.cpu), support_name(r.cuda));
    t += line;
  }
  return t;
}

std::string support_markdown() {
  auto cell = [](Support s) { return s == Support::measured ? std::string("✓ measured") : std::string(support_name(s)); };
  std::string t = "| capability | flag | CPU | CUDA |\n|---|---|---|---|\n";
  // (a pipe inside a cell, even in code, ends the cell unless escaped)
  auto escaped = [](const char* s) {
    std::string out;
    for (; *s; ++s) {
      if (*s == '|') out += '\\';
      out += *s;
    }
    return out;
  };
  for (const SupportRow& r : support_matrix())
    t += str_cat("| ", r.name, " | `", escaped(r.flag), "` | ", cell(r.cpu), " | ", cell(r.cuda), " |\n");
  return t;
}

}  // namespace sat
